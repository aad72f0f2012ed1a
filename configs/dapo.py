"""DAPO: clip-higher, token-level loss, dynamic sampling, overlong reward shaping.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476. GRPO advantages; clip range [1 - 0.2, 1 + 0.28]; every token of the
batch weighs the same (`token_mean`); groups whose rewards are all equal are dropped
and more prompts sampled; a graded length penalty over the last `cache_len` tokens
before `max_len` (the paper: 4,096 of 20,480, a fifth); no KL term.

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/dapo.py --workdir=/tmp/dapo
  python -m launch.train --config=configs/dapo.py:runlocal --workdir=/tmp/dapo_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=dapo` (100 steps, seed 0, 2 CPU
cores, 67 s) took held-out greedy accuracy from 0.637 to 0.879 at step 20 and
0.910 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset, ref


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "grpo",
      "algo.loss.aggregation": "token_mean",
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "clip",
      "algo.loss.clip_low": 0.2,
      "algo.loss.clip_high": 0.28,  # clip-higher: room for low-probability tokens to rise
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
      "algo.dynamic_sampling.enabled": True,
      "algo.dynamic_sampling.max_rounds": 3,
      "algo.overlong.enabled": True,
      # overlong.max_len follows sampling.max_new_tokens (the schema's default).
      "algo.overlong.cache_len": ref("sampling.max_new_tokens") // 5,
      "algo.overlong.mask_truncated": False,  # the paper's final recipe shapes, not filters
  })
