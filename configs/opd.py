"""On-policy distillation: the policy samples, a frozen teacher scores every token.

prime-rl's `opd` algorithm (`src/prime_rl/orchestrator/algo/opd.py` and
`ref_kl_loss_fn` in `src/prime_rl/trainer/rl/loss.py`, commit 559b447), the method of
Agarwal et al. 2024, "On-Policy Distillation of Language Models" (GKD, arXiv:2306.13649)
with the reverse KL, as in Thinking Machines' on-policy distillation: per token
`-m·sg(log π_T - log π)·ρ + 1e-3·(log ρ)²`, token mean, where `m = 0` for tokens whose
probability fell more than 0.2 below the sampler's. No reward or advantage enters the
loss (`algo.loss.pg_coef = 0`) and G only fans out sampling. The per-token reverse KL to the teacher is logged as
`distill/reverse_kl`. So the preset names no reward functions, on any data, and no
held-out evaluation (which reports the first function): set `config.rewards.functions`
and `config.train.eval_every` to score the samples and evaluate as well, as
`configs/arithmetic.py:preset=opd` does with the task's exact-match reward.

`config.teacher.path` is required: a Hugging Face directory (local or gs://) of a model
with the policy's tokenizer (checked at start); it may be larger or of another family.
It is frozen and sharded like the reference; only its parameters are loaded. To distil
inside an RL run instead, keep an RL preset and set `algo.distill.shaping_coef` (miles'
advantage shaping) or `algo.distill.coef` beside `pg_coef = 1`.

Run:
  python -m launch.train --config=configs/opd.py --config.teacher.path=TEACHER \
      --config.model.path=STUDENT --workdir=/tmp/opd
  python -m launch.train --config=configs/arithmetic.py:preset=opd --workdir=/tmp/opd_arith
Hardware: as configs/grpo.py, plus the teacher's parameters and one forward of it per
step.
Expected result: on the demo's task, from the shipped warm start with the shipped
GRPO-trained model as teacher (`--config=configs/arithmetic.py:preset=opd`, seed 0,
2 CPU cores, 2026-12-01): held-out greedy accuracy 0.637 at step 0, 0.801 / 0.844 / 0.879
/ 0.906 at steps 10 / 20 / 30 / 40 (GRPO in the same session: 0.797 / 0.852 / 0.883 /
0.895), 0.910 at 60 and 0.898 at 100, against the teacher's 0.918; `distill/reverse_kl`
fell from 0.22 (mean of steps 1-5) to 0.02 (steps 96-100). 64 s for 40 steps (GRPO 61 s).
README's "Recipes side by side".
"""
from jaxrl_llm.config import REQUIRED, make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "teacher.path": REQUIRED,
      "rewards.functions": (),  # the teacher carries the signal
      "rewards.weights": (),
      "train.eval_every": 0,  # the held-out evaluation reports the first reward function
      "algo.loss.pg_coef": 0.0,
      "algo.loss.aggregation": "token_mean",
      "algo.distill.coef": 1.0,
      "algo.distill.mask_low": 0.2,
      "algo.distill.log_ratio_coef": 1e-3,
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
  })
