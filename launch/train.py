r"""Trains with a config: `python -m launch.train --config=... --workdir=...`.

The same program as the console script `jaxrl-llm-train` (jaxrl_llm/cli.py, where the
flags and exit statuses are documented), runnable from a checkout without installing:

  python -m launch.train --config=configs/grpo.py:runlocal --workdir=/tmp/grpo \
      --config.train.steps=200 --config.algo.kl.coef=0
"""
from jaxrl_llm import cli

if __name__ == "__main__":
  cli.run()
