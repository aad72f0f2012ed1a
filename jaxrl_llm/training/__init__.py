"""The RL trainer: `train(config, workdir)`; see `loop.py`."""
from jaxrl_llm.training.loop import train

__all__ = ["train"]
