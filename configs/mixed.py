"""Mixed sources: a GRPO source and an on-policy distillation source in one run.

prime-rl sets "the algorithm per training source, so one run can mix them", while "the
RL loss is chosen once for the run" (its `docs/algorithms.md` and
`src/prime_rl/orchestrator/algo/`, commit 559b447). Here `config.sources.NAME` is such
a source: its data, its share of each step's prompts (`weight`), its reward functions
and its per-row algorithm (`algo`: the advantage estimator and normalisation,
`loss.pg_coef`, `distill.coef`, `distill.shaping_coef`); `jaxrl_llm/config/sources.py`.

* `rl`: GRPO (Shao et al. 2024, arXiv:2402.03300): group-normalised outcome
  advantages through the run's loss, PPO's token clip (0.2), `1/L` per response.
* `distill`: prime-rl's `opd` (Agarwal et al. 2024, arXiv:2306.13649, with the reverse
  KL): no policy-gradient term (`pg_coef = 0`), the teacher's per-token log-ratio
  through `-m·sg(log π_T - log π)·ρ + 1e-3·(log ρ)²` (`distill.coef = 1`).

Each term is normalised over its own rows (prime-rl's `L = Σ ℓ_rl / N_rl + Σ ℓ_ce / N_ce`),
no KL to a reference (`algo.kl.coef = 0`, as prime-rl). Metrics per source:
`reward_mean/rl`, `rows/distill`, `response_length_mean/NAME`, `eval/NAME/reward/...`.
Both sources default to the demo's task; point them at your data with
`--config.sources.rl.data=jsonl:...`, shift the mix with `--config.sources.rl.weight=0.7`
(weights are normalised; a change does not recompile).

Run:
  python -m launch.train --config=configs/mixed.py --config.teacher.path=TEACHER \
      --config.model.path=STUDENT --workdir=/tmp/mixed
  python -m launch.train --config=configs/arithmetic.py:preset=mixed --workdir=/tmp/mixed_arith
Hardware: as configs/opd.py.
Expected result: on the demo's task (`configs/arithmetic.py:preset=mixed`, half the
prompts each, seed 0, 2 CPU cores), see README's "Recipes side by side".
"""
from jaxrl_llm.config import REQUIRED, make_preset, source_config


def get_config(arg=None):
  rl = source_config("task:arithmetic", weight=0.5)
  distill = source_config("task:arithmetic", weight=0.5)
  distill.algo.loss.pg_coef = 0.0
  distill.algo.distill.coef = 1.0
  return make_preset(arg, {
      "teacher.path": REQUIRED,
      "sources.rl": rl,
      "sources.distill": distill,
      "algo.loss.aggregation": "seq_mean_token_mean",
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "clip",
      "algo.loss.clip_low": 0.2,
      "algo.loss.clip_high": 0.2,
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
  })
