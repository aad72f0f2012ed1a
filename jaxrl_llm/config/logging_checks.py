"""`config.logging` checked: the trackers are known names whose pip extras are installed.

The trackers themselves are `jaxrl_llm.training.trackers`; their names and extras live here,
where `validate` checks them before anything loads (`find_spec`: nothing is imported).
"""
from __future__ import annotations

import importlib.util

from jaxrl_llm.config.errors import ConfigError
from jaxrl_llm.config.errors import fail as _fail

# Each tracker and the pip extra it needs, which is also the module it imports (None: a
# dependency of the package itself).
TRACKERS = {"tensorboard": None, "jsonl": None, "wandb": "wandb", "mlflow": "mlflow",
            "trackio": "trackio"}


def tracker_names(trackers) -> tuple[str, ...]:
  """`config.logging.trackers` as a tuple of names. ml_collections reads the command line's
  `--config.logging.trackers=tensorboard,wandb` as one element, 'tensorboard,wandb'."""
  return tuple(name.strip() for item in trackers for name in str(item).split(",")
               if name.strip())


def check_logging(c) -> None:
  names = tracker_names(c.trackers)
  unknown = [n for n in names if n not in TRACKERS]
  twice = [n for n in names if names.count(n) > 1]
  if unknown or twice:
    problem = f"{unknown[0]!r} is not a tracker" if unknown else f"{twice[0]!r} is named twice"
    raise ConfigError(f"config.logging.trackers={tuple(c.trackers)!r}: {problem}; expected "
                      f"names from {list(TRACKERS)}, each once (on the command line "
                      "comma-separated: --config.logging.trackers=tensorboard,jsonl,wandb)")
  for name in names:
    extra = TRACKERS[name]
    if extra and importlib.util.find_spec(extra) is None:
      raise ConfigError(f"config.logging.trackers: {name!r} needs the {extra} extra: "
                        f"pip install 'jaxrl_llm[{extra}]'")
  if not (isinstance(c.project, str) and c.project.strip()):
    _fail("logging.project", c.project, "a name (the wandb project, MLflow experiment and "
          "trackio project the run logs to)")
  if c.rollouts_every < 0:
    _fail("logging.rollouts_every", c.rollouts_every,
          ">= 0 (0 = no rollouts.jsonl; N = every N-th step's completions)")
