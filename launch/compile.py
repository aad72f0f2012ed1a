r"""Compiles every program of a training step for a TPU slice, on any host:
`python -m launch.compile --config=... [--topology=v5p:2x2x4]`.

The same program as the console script `jaxrl-llm-compile` (jaxrl_llm/aot/cli.py, where
the flags, the report and the exit statuses are documented), runnable from a checkout
without installing:

  python -m launch.compile --config=configs/qwen3_gsm8k.py:tpu_v5e_8,size=1.7b
"""
from jaxrl_llm.aot import cli

if __name__ == "__main__":
  cli.run()
