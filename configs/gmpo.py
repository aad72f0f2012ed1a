"""GMPO: geometric mean of a response's token ratios, clipped in log space.

Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673. Per
response: `-A·exp(mean_t clip(log ρ_t, -0.4, 0.4))`, keeping per token the
pessimistic of clipped and unclipped for the sign of A; one term per response
(`seq_mean_token_mean` over a term that is constant along the response is exactly
the mean over responses); GRPO advantages; no KL.

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/gmpo.py --workdir=/tmp/gmpo
  python -m launch.train --config=configs/gmpo.py:runlocal --workdir=/tmp/gmpo_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=gmpo` (100 steps, seed 0, 2 CPU
cores, 65 s) took held-out greedy accuracy from 0.637 to 0.844 at step 20 and
0.910 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "grpo",
      "algo.loss.aggregation": "seq_mean_token_mean",  # = mean over responses for gmpo
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "gmpo",
      "algo.loss.clip_low": 0.4,  # log space: ρ >= e^-0.4
      "algo.loss.clip_high": 0.4,  # log space: ρ <= e^0.4
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
  })
