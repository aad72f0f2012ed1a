"""RLOO: leave-one-out baseline, one on-policy REINFORCE step, KL in the reward.

Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
Learning from Human Feedback in LLMs", arXiv:2402.14740 (after Kool et al. 2019).
Advantage `R_i - mean_{j≠i} R_j`, where the response reward already carries
`-β·Σ_t (logp - ref_logp)`; loss `-A·logp` summed over a response's tokens, mean over
responses; no ratio and no clip, since each batch is used for one step.

Old log-probs: no ratio reads them; the KL-in-reward term takes the sampler's
(`algo.old_logp = "auto"` resolves to "sampler" without a ratio).

Run:
  python -m launch.train --config=configs/rloo.py --workdir=/tmp/rloo
  python -m launch.train --config=configs/rloo.py:runlocal --workdir=/tmp/rloo_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=rloo` (100 steps, seed 0, 2 CPU
cores, 73 s) took held-out greedy accuracy from 0.637 to 0.859 at step 20 and
0.918 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "rloo",
      "algo.loss.aggregation": "seq_mean_token_sum",
      "algo.loss.ratio": "none",
      "algo.loss.trust_region": "none",
      "algo.kl.coef": 0.05,
      "algo.kl.estimator": "k1",
      "algo.kl.placement": "reward",
      "algo.num_iterations": 1,  # on-policy: the surrogate has no importance ratio
      "algo.num_minibatches": 1,
  })
