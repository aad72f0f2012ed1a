"""IPO (prime-rl): a symmetric trust region in probability, plus a squared log-ratio.

prime-rl's `ipo` loss (`ipo_loss_fn` in `src/prime_rl/trainer/rl/loss.py`, commit
559b447): per token `-1[|π - μ| <= 0.1]·ρ·A + 1e-3·(log ρ)²`, normalised by the run's
token count (`token_mean`), with GRPO's group advantages and no KL to a reference. The
region is on the probability of the sampled token, not on the ratio, so a rare token
may move by a large ratio and a likely one by at most 0.1. The masking is from DPPO
(arXiv:2602.04879); prime-rl calls the squared log-ratio Kimi K2.5's KL term
(arXiv:2602.02276).

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/ipo.py --workdir=/tmp/ipo
  python -m launch.train --config=configs/ipo.py:runlocal --workdir=/tmp/ipo_local  # CPU
Hardware: as configs/grpo.py.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=ipo` (100 steps, seed 0, 2 CPU
cores, 104 s, 2026-12-01) took held-out greedy accuracy from 0.637 to 0.859 at step 20 and
0.922 at step 100, the same curve as CISPO's and DPPO-TV's: with one update per batch the
gradient is taken on-policy (π = μ), where nothing is masked and every token-mean
`-ρA` loss has the same gradient; the masks act over several minibatches or passes, with
asynchronous rollouts, or where the sampler's numerics differ. README's "Recipes side
by side" has every preset.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "algo.loss.trust_region": "ipo",
      "algo.loss.prob_low": 0.1,
      "algo.loss.prob_high": 0.1,
  }, base="dppo_tv")  # the rest as prime-rl's default loss: token mean, GRPO, no KL
