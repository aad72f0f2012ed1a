"""jaxrl_llm: JAX-native reinforcement-learning post-training for language models."""
import logging as _logging


class _NoTorchAdvice(_logging.Filter):
  """Drops transformers' advice at import, "PyTorch was not found. Models won't be
  available ...": jaxrl_llm's models are Flax and need no PyTorch, and without this every
  command in the demo's environment (which has none) would print it. Its other warnings
  pass."""

  def filter(self, record: _logging.LogRecord) -> bool:
    return not str(record.msg).startswith("PyTorch was not found.")


# Set before anything imports transformers (which logs the advice on its "transformers"
# logger as it loads).
_logging.getLogger("transformers").addFilter(_NoTorchAdvice())
