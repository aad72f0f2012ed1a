"""CISPO: clip the importance weight, not the update; every token keeps a gradient.

Chen et al. 2025 (MiniMax), "MiniMax-M1: Scaling Test-Time Compute Efficiently with
Lightning Attention", arXiv:2506.13585, eq. 4; also the loss of ScaleRL (Khatri et
al. 2025, arXiv:2510.13786). Loss `-sg[min(ρ, 1 + clip_high)]·A·logp`, token mean
over the batch, GRPO advantages, no KL. No lower bound (`clip_low >= 1`), as in the
paper; the weight is capped at 4 (`clip_high = 3`), the cap Tinker uses by default
for CISPO after ScaleRL.

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/cispo.py --workdir=/tmp/cispo
  python -m launch.train --config=configs/cispo.py:runlocal --workdir=/tmp/cispo_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=cispo` (100 steps, seed 0, 2 CPU
cores, 65 s) took held-out greedy accuracy from 0.637 to 0.859 at step 20 and
0.922 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "grpo",
      "algo.loss.aggregation": "token_mean",
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "cispo",
      "algo.loss.clip_low": 1.0,  # >= 1: no lower bound on the weight
      "algo.loss.clip_high": 3.0,  # weight <= 1 + 3 = 4
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
  })
