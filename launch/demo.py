r"""`make demo`: GRPO on arithmetic from the shipped warm start, then a plot.

  python -m launch.demo --workdir=workdir/demo [--config.train.steps=60 ...]

Prints a progress bar and a held-out accuracy table while it runs; at the end writes
DIR/curves.png (reward and held-out accuracy per step) and DIR/export/ (the model).
"""
import os

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "grpo_arithmetic.py"),
    "Experiment config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdir/demo", "Output directory.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from jaxrl_llm import paths, plots, training  # pylint: disable=g-import-not-at-top
  from jaxrl_llm.training import evaluation  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value
  training.train(_CONFIG.value, workdir)
  metrics = paths.join(workdir, "metrics.jsonl")
  png = paths.join(workdir, "curves.png")
  accuracy = evaluation.headline_key(_CONFIG.value.rewards)  # the exact-match reward's mean
  plots.plot_curves(metrics, png, ("reward_mean", accuracy),
                    title="GRPO on arithmetic (CPU demo)")
  evals = [r for r in plots.read_metrics(metrics) if accuracy in r]
  print(f"\nheld-out accuracy ({accuracy}): {evals[0][accuracy]:.3f} at step "
        f"{evals[0]['step']} -> {evals[-1][accuracy]:.3f} at step {evals[-1]['step']}")
  print(f"curves: {png}\nmodel:  {paths.join(workdir, 'export')}")


if __name__ == "__main__":
  app.run(main)
