"""The RL trainer: `train(config, workdir)`; see `loop.py`."""
from jaxrl_llm.training.loop import greedy_samples
from jaxrl_llm.training.loop import train

__all__ = ["greedy_samples", "train"]
