"""MaxRL: GRPO with mean-normalised group advantages `(R - mean_g) / mean_g`.

Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning", arXiv:2602.02710.
For 0/1 rewards the advantage weights a prompt by 1/pass-rate, moving the objective
from expected reward toward the log-likelihood of success; a group that never
succeeds (mean 0) gets zero advantage. Every other axis is GRPO's (configs/grpo.py).

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/max_rl.py --workdir=/tmp/max_rl
  python -m launch.train --config=configs/max_rl.py:runlocal --workdir=/tmp/max_rl_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=max_rl` (100 steps, seed 0, 2 CPU
cores, 77 s) took held-out greedy accuracy from 0.637 to 0.875 at step 20 and
0.926 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {"algo.advantage.estimator": "max_rl"}, base="grpo")
