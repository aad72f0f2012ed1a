"""GRPO: group-normalised outcome advantages, PPO token clip, k3 KL in the loss.

Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
Language Models", arXiv:2402.03300, §4.1. Advantage `(R - mean_g) / (std_g + eps)`
per group of G responses, every response weighted equally (`1/L` per response, then
the group mean), clip 0.2, `β = 0.04` on the k3 estimator of KL(π‖π_ref).

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/grpo.py --workdir=/tmp/grpo
  python -m launch.train --config=configs/grpo.py:runlocal --workdir=/tmp/grpo_local  # CPU
Hardware: the default tiny model runs on one CPU/GPU/TPU host; set `model.path` and
`mesh` for a real model.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=grpo` (100 steps, seed 0, 2 CPU
cores, 65 s) took held-out greedy accuracy from 0.637 to 0.852 at step 20 and
0.918 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "grpo",
      "algo.advantage.std_ddof": 0,
      "algo.advantage.scale": "group",
      "algo.loss.aggregation": "seq_mean_token_mean",
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "clip",
      "algo.loss.clip_low": 0.2,
      "algo.loss.clip_high": 0.2,
      "algo.kl.coef": 0.04,
      "algo.kl.estimator": "k3",
      "algo.kl.placement": "loss",
  })
