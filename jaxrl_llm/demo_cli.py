r"""`jaxrl-llm-demo` (`make demo`): GRPO on a built-in task from the shipped warm start, then
a plot.

  jaxrl-llm-demo --workdir=workdir/demo [--config.train.steps=60 ...]
  python -m launch.demo --task=calculator --workdir=workdir/calculator   # the agent demo
  python -m launch.demo --task=moe --workdir=workdir/moe                 # an MoE policy

`--task` picks the config: `arithmetic` (default, the preset grpo_arithmetic,
configs/grpo_arithmetic.py), `calculator` (grpo_calculator: multi-turn episodes with a
calculator tool) or `moe` (grpo_arithmetic_moe: arithmetic from the shipped MoE warm start,
with routing replay); `--config` (a preset name or a config file) replaces it. Prints a
progress bar and a held-out accuracy table while it runs; at the end writes DIR/curves.png
(reward and held-out accuracy per step) and DIR/export/ (the model).

Exit status: 0 when the demo finished; 2 for a bad flag, config file or config value (one
line on stderr).
"""
import sys

from absl import flags

from jaxrl_llm import command_line
from jaxrl_llm.config import presets

TASKS = {"arithmetic": ("grpo_arithmetic", "GRPO on arithmetic (CPU demo)"),
         "calculator": ("grpo_calculator", "GRPO with a calculator tool (CPU agent demo)"),
         "moe": ("grpo_arithmetic_moe", "GRPO on arithmetic, an MoE with routing replay")}


def _task_in_argv(argv) -> str:
  """`--task`'s value, read before flags are parsed: it chooses `--config`'s default."""
  for i, arg in enumerate(argv):
    if arg.startswith("--task="):
      return arg.split("=", 1)[1]
    if arg == "--task" and i + 1 < len(argv):
      return argv[i + 1]
  return "arithmetic"


_TASK = flags.DEFINE_enum("task", "arithmetic", sorted(TASKS), "The built-in task to learn.")
_CONFIG = command_line.config_flag(
    "A preset name or a config file (path[:arg]) (default: --task's preset).",
    default=presets.path(TASKS.get(_task_in_argv(sys.argv), TASKS["arithmetic"])[0]))
_WORKDIR = flags.DEFINE_string("workdir", "workdir/demo", "Output directory.")


def main():
  # pylint: disable=g-import-not-at-top  (after flag parsing)
  from jaxrl_llm import paths, plots, training
  from jaxrl_llm.training import evaluation
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


def run():
  command_line.run(main, _CONFIG)


if __name__ == "__main__":
  run()
