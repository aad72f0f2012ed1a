"""Smoke test: GRPO on the tiny in-config Llama, two steps, on a laptop CPU.

The end-to-end test of the trainer runs this file; it exercises sampling, rewards,
advantages, the policy update (with KL to the reference) and checkpointing in well
under a minute. Axes as configs/grpo.py; sizes as its `runlocal` variant.

Run:
  python -m launch.train --config=configs/smoke.py --workdir=/tmp/smoke
Hardware: CPU (any).
Expected result: two steps finish with finite loss; no learning is expected.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "optimizer.lr": 1e-4,  # a tiny random model; make the two steps visible
      "train.log_every": 1,
      "checkpoint.every": 2,
  }, base="grpo:runlocal", runlocal=False)  # already local; takes no argument
