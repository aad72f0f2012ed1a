"""SAPO: a smooth sigmoid gate on the ratio instead of a hard clip.

Gao et al. 2025 (Qwen), "Soft Adaptive Policy Optimization", arXiv:2511.20347. Loss
`-f(ρ)·A` with `f(ρ) = σ(τ(ρ - 1))·4/τ`: the gradient weight is 1 at ρ = 1 and decays
smoothly as ρ moves away, faster for negative advantages (`tau_neg = 1.05 >
tau_pos = 1.0`); GRPO advantages, `1/L` per response; no KL.

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/sapo.py --workdir=/tmp/sapo
  python -m launch.train --config=configs/sapo.py:runlocal --workdir=/tmp/sapo_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=sapo` (100 steps, seed 0, 2 CPU
cores, 60 s) took held-out greedy accuracy from 0.637 to 0.844 at step 20 and
0.910 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "grpo",
      "algo.loss.aggregation": "seq_mean_token_mean",
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "sapo",
      "algo.loss.tau_pos": 1.0,
      "algo.loss.tau_neg": 1.05,
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
  })
