r"""`make demo`: GRPO on a built-in task from the shipped warm start, then a plot:
`python -m launch.demo [--task=calculator|moe] --workdir=...`.

The same program as the console script `jaxrl-llm-demo` (jaxrl_llm/demo_cli.py, where the
flags, the tasks and the outputs are documented), runnable from a checkout without
installing:

  python -m launch.demo --workdir=workdir/demo [--config.train.steps=60 ...]
  python -m launch.demo --task=calculator --workdir=workdir/calculator   # the agent demo
"""
from jaxrl_llm import demo_cli

if __name__ == "__main__":
  demo_cli.run()
