"""REINFORCE++: token-level returns with KL in the reward, batch-normalised, clipped.

Hu et al. 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
Language Models", arXiv:2501.03262. Token rewards are the outcome on the last token
minus `β·(logp - ref_logp)` on every token; returns `G_t = Σ_{k≥t} γ^{k-t} r_k` are
normalised over all valid tokens of the batch (no per-prompt baseline, no critic);
PPO token clip 0.2, token-mean loss.

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/reinforce_pp.py --workdir=/tmp/reinforce_pp
  python -m launch.train --config=configs/reinforce_pp.py:runlocal --workdir=/tmp/rpp_local
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=reinforce_pp` (100 steps, seed 0, 2 CPU
cores, 75 s) took held-out greedy accuracy from 0.637 to 0.863 at step 20 and
0.918 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "reinforce_pp",
      "algo.advantage.gamma": 1.0,
      "algo.loss.aggregation": "token_mean",
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "clip",
      "algo.loss.clip_low": 0.2,
      "algo.loss.clip_high": 0.2,
      "algo.kl.coef": 0.01,  # OpenRLHF's REINFORCE++ examples
      "algo.kl.estimator": "k1",
      "algo.kl.placement": "reward",
  })
