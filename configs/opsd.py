"""On-policy self-distillation: the policy, shown an expert demonstration, is its own teacher.

prime-rl's `opsd` (`src/prime_rl/orchestrator/algo/opsd.py`, commit 559b447), after SDFT
(arXiv:2601.19897): each sampled completion is scored by prefill under the live policy
with a hint block before the prompt, a system message of `algo.distill.hint_template`
(prime-rl's template by default) holding the record's `algo.distill.hint_field`
(`demonstration`); the hint's tokens are sliced off and the completion's log-probs
under the hinted policy are the teacher's. The loss is opd's
(`configs/opd.py`): per token `-m·sg(log π_hint - log π)·ρ + 1e-3·(log ρ)²`, token mean,
no advantage (`algo.loss.pg_coef = 0`), no separate model. The hint block is the chat
template's rendering of that one system message (the plain text without a template),
at most `algo.distill.max_hint_len` tokens; `distill/reverse_kl` logs the gap.

`data.source` is required: a dataset whose records carry the demonstration, e.g. JSONL
lines `{"prompt": ..., "demonstration": ...}` (checked at start). As in opd, no reward
functions and no held-out evaluation unless set (`config.rewards.functions`,
`config.train.eval_every`): the hinted policy carries the signal.

Run:
  python -m launch.train --config=configs/opsd.py --config.data.source=jsonl:data/{split}.jsonl \
      --config.model.path=MODEL --workdir=/tmp/opsd
Hardware: as configs/grpo.py, plus one more policy forward per step over the hinted rows.
Expected result: not measured on a real model (no weights on this machine); the tests
run it on a tiny random model and check that the teacher's log-probs are the policy's
own after the hint (`tests/training/self_distillation_test.py`).
"""
from jaxrl_llm.config import REQUIRED, make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "data.source": REQUIRED,
      "rewards.functions": (),  # the hinted policy carries the signal
      "rewards.weights": (),
      "train.eval_every": 0,  # the held-out evaluation reports the first reward function
      "algo.loss.pg_coef": 0.0,
      "algo.loss.aggregation": "token_mean",
      "algo.distill.coef": 1.0,
      "algo.distill.teacher": "self",
      "algo.distill.hint_field": "demonstration",
      "algo.distill.mask_low": 0.2,
      "algo.distill.log_ratio_coef": 1e-3,
      "algo.kl.coef": 0.0,
      "algo.kl.placement": "none",
  })
