"""DPPO-Binary-TV with a squared log-ratio term: prime-rl's default RL loss.

prime-rl's `default_loss_fn` (`src/prime_rl/trainer/rl/loss.py`, commit 559b447): per
token `-keep·ρ·A + 1e-3·(log ρ)²`, where a token leaves the first term when its
probability already moved 0.2 in the direction its advantage pushes (`π - μ > 0.2`
with A > 0, `π - μ < -0.2` with A < 0): a binary trust region in total variation (DPPO,
arXiv:2602.04879) and Kimi K2.5's squared log-ratio (arXiv:2602.02276). Normalised by
the run's token count (`token_mean`), GRPO's group advantages, no KL to a reference.

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/dppo_tv.py --workdir=/tmp/dppo_tv
  python -m launch.train --config=configs/dppo_tv.py:runlocal --workdir=/tmp/dppo_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=dppo_tv` (100 steps, seed 0, 2 CPU
cores, 105 s, 2026-12-01) took held-out greedy accuracy from 0.637 to 0.859 at step 20 and
0.922 at step 100, as IPO and CISPO (see configs/ipo.py for why: one on-policy update per
batch masks nothing). README's "Recipes side by side" has every preset.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "algo.advantage.estimator": "grpo",
      "algo.loss.aggregation": "token_mean",
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "dppo_tv",
      "algo.loss.prob_low": 0.2,
      "algo.loss.prob_high": 0.2,
      "algo.loss.log_ratio_coef": 1e-3,
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
  })
