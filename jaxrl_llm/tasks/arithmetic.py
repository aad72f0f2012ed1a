"""`task:arithmetic`: evaluate a short integer expression.

The format is built for a character-level tokenizer and a tiny model: the
prompt is the expression and `=`, the completion is the integer alone, then
end-of-sequence. No spaces, no words:

  record      {'prompt': '12+7*3=', 'answer': 33}
  completion  '33'  (then EOS)

Operands are integers in [0, max_value] joined by operators from `operators`
(`+ - *`, usual precedence, so `12+7*3` is 33); answers may be negative
(`3-12=` -> `-9`). Difficulty: `min_operands`..`max_operands` operands and
`max_value`. With the defaults a prompt is at most 9 characters and an answer at
most 5 (`20*20*20` = 8000).

Rewards: `jaxrl_llm.rewards.arithmetic:arithmetic_exact` (the answer) and
`...:arithmetic_format` (the completion is one integer and nothing else).
"""
import functools
import random
from typing import Sequence

from jaxrl_llm.rewards import expression
from jaxrl_llm.tasks import base

OPERATORS = "+-*"


def make_problem(rng: random.Random, *, min_operands: int = 2, max_operands: int = 3,
                 max_value: int = 20, operators: str = OPERATORS) -> dict:
  """Draws one problem: `{'prompt': '12+7*3=', 'answer': 33}`."""
  count = rng.randint(min_operands, max_operands)
  text = str(rng.randint(0, max_value))
  for _ in range(count - 1):
    text += rng.choice(operators) + str(rng.randint(0, max_value))
  value = expression.evaluate(text).value
  return {"prompt": text + "=", "answer": int(value)}


def _check_options(min_operands, max_operands, max_value, operators):
  if not 1 <= min_operands <= max_operands:
    raise ValueError(f"arithmetic: need 1 <= min_operands <= max_operands, got "
                     f"{min_operands}, {max_operands}.")
  if max_value < 1:
    raise ValueError(f"arithmetic: max_value must be >= 1, got {max_value}.")
  if not operators or set(operators) - set(OPERATORS):
    raise ValueError(f"arithmetic: operators must be drawn from {OPERATORS!r}, "
                     f"got {operators!r}.")


def load_split(split: str, *, seed: int = 0, num_train: int = 100_000,
               num_eval: int = 500, min_operands: int = 2, max_operands: int = 3,
               max_value: int = 20, operators: str = OPERATORS) -> Sequence[dict]:
  """The 'train' or 'eval' split; see `tasks.base` for how splits are drawn.

  Args:
    split: 'train' or 'eval' (disjoint prompts).
    seed: the splits' seed.
    num_train: train records (drawn on demand, so a large number costs nothing).
    num_eval: eval records, all distinct.
    min_operands, max_operands, max_value, operators: difficulty.

  Returns:
    A sequence of records `{'prompt': str, 'answer': int}`.
  """
  _check_options(min_operands, max_operands, max_value, operators)
  make = functools.partial(make_problem, min_operands=min_operands,
                           max_operands=max_operands, max_value=max_value,
                           operators=operators)
  return base.make_split(make, task="arithmetic", split=split, seed=seed,
                         num_train=num_train, num_eval=num_eval)


def demonstration(record: dict) -> str:
  """The target completion: the answer's digits (the trainer appends EOS)."""
  return str(record["answer"])


TASK = base.Task(
    load_split=load_split,
    demonstration=demonstration,
    reward_functions=("jaxrl_llm.rewards.arithmetic:arithmetic_exact",
                      "jaxrl_llm.rewards.arithmetic:arithmetic_format"),
    reward_weights=(1.0, 0.1),
)
