r"""Evaluates a saved policy (greedy pass@1, pass@k, maj@K, mean reward per source):
`python -m launch.evaluate --config=... --model=DIR|WORKDIR[:STEP] [--samples=K]`.

The same program as the console script `jaxrl-llm-evaluate` (jaxrl_llm/eval_cli.py, where
the flags, the outputs and the exit statuses are documented), runnable from a checkout
without installing:

  python -m launch.evaluate --config=configs/grpo_arithmetic.py \
      --model=jaxrl_llm/assets/arithmetic_sft --samples=8 --output=/tmp/eval_sft
"""
from jaxrl_llm import eval_cli

if __name__ == "__main__":
  eval_cli.run()
