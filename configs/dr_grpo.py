"""Dr. GRPO: GRPO without its length and difficulty biases.

Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783. Advantage `R - mean_g` (no std division); the loss sums token
terms and divides by a constant, `B · max_new_tokens`, instead of by each response's
length; no KL term.

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/dr_grpo.py --workdir=/tmp/dr_grpo
  python -m launch.train --config=configs/dr_grpo.py:runlocal --workdir=/tmp/dr_grpo_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=dr_grpo` (100 steps, seed 0, 2 CPU
cores, 56 s) took held-out greedy accuracy from 0.637 to 0.867 at step 20 and
0.918 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset, ref


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "dr_grpo",
      "algo.loss.aggregation": "seq_mean_token_sum_norm",
      # Follows sampling.max_new_tokens, also when that is overridden.
      "algo.loss.norm_length": ref("sampling.max_new_tokens"),
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "clip",
      "algo.loss.clip_low": 0.2,
      "algo.loss.clip_high": 0.2,
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
  })
