r"""Trains with a config file: parses flags, then makes one library call.

  python -m launch.train --config=configs/grpo.py:runlocal --workdir=/tmp/grpo \
      --config.train.steps=200 --config.algo.kl.coef=0

Also installed as the console script `jaxrl-llm-train`.
"""
from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (path[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and exports.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from jaxrl_llm import training  # pylint: disable=g-import-not-at-top  (after flag parsing)
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  config = _CONFIG.value
  print(config)
  training.train(config, _WORKDIR.value)


def run():
  app.run(main)


if __name__ == "__main__":
  run()
