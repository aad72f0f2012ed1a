"""jaxrl_llm: JAX-native reinforcement-learning post-training for language models."""
