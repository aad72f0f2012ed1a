r"""`make demo`: GRPO on a built-in task from the shipped warm start, then a plot.

  python -m launch.demo --workdir=workdir/demo [--config.train.steps=60 ...]
  python -m launch.demo --task=calculator --workdir=workdir/calculator   # the agent demo
  python -m launch.demo --task=moe --workdir=workdir/moe                 # an MoE policy

`--task` picks the config: `arithmetic` (default, configs/grpo_arithmetic.py),
`calculator` (configs/grpo_calculator.py: multi-turn episodes with a calculator tool) or
`moe` (configs/grpo_arithmetic_moe.py: arithmetic from the shipped MoE warm start, with
routing replay); `--config=FILE` replaces it. Prints a progress bar and a held-out accuracy table while it
runs; at the end writes DIR/curves.png (reward and held-out accuracy per step) and
DIR/export/ (the model).
"""
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")
TASKS = {"arithmetic": ("grpo_arithmetic.py", "GRPO on arithmetic (CPU demo)"),
         "calculator": ("grpo_calculator.py", "GRPO with a calculator tool (CPU agent demo)"),
         "moe": ("grpo_arithmetic_moe.py", "GRPO on arithmetic, an MoE with routing replay")}


def _task_in_argv(argv) -> str:
  """`--task`'s value, read before flags are parsed: it chooses `--config`'s default."""
  for i, arg in enumerate(argv):
    if arg.startswith("--task="):
      return arg.split("=", 1)[1]
    if arg == "--task" and i + 1 < len(argv):
      return argv[i + 1]
  return "arithmetic"


_TASK = flags.DEFINE_enum("task", "arithmetic", sorted(TASKS), "The built-in task to learn.")
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(CONFIGS, TASKS.get(_task_in_argv(sys.argv), TASKS["arithmetic"])[0]),
    "Experiment config file (default: --task's).", lock_config=True)
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
  plots.plot_curves(metrics, png, ("reward_mean", accuracy), title=TASKS[_TASK.value][1])
  evals = [r for r in plots.read_metrics(metrics) if accuracy in r]
  print(f"\nheld-out accuracy ({accuracy}): {evals[0][accuracy]:.3f} at step "
        f"{evals[0]['step']} -> {evals[-1][accuracy]:.3f} at step {evals[-1]['step']}")
  print(f"curves: {png}\nmodel:  {paths.join(workdir, 'export')}")


if __name__ == "__main__":
  app.run(main)
