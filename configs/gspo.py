"""GSPO: sequence-level importance ratio and sequence-level clipping.

Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071. The ratio
is the length-normalised sequence likelihood ratio
`s = exp(mean_t (logp - old_logp))`, clipped to [1 - 3e-4, 1 + 4e-4] (narrow because
it is a per-token geometric mean); GRPO advantages, one term per response; no KL
term. Each rollout batch is split into four minibatches as in the paper, so the clip
acts. Set `algo.loss.ratio = 'sequence_token'` for GSPO-token.

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/gspo.py --workdir=/tmp/gspo
  python -m launch.train --config=configs/gspo.py:runlocal --workdir=/tmp/gspo_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=gspo` (100 steps, seed 0, 2 CPU
cores, 65 s) took held-out greedy accuracy from 0.637 to 0.871 at step 20 and
0.875 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "grpo",
      "algo.loss.aggregation": "seq_mean_token_mean",
      "algo.loss.ratio": "sequence",
      "algo.loss.trust_region": "clip",
      "algo.loss.clip_low": 3e-4,
      "algo.loss.clip_high": 4e-4,
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
      "algo.num_minibatches": 4,
  }, local={"algo.num_minibatches": 2})
