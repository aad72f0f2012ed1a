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

A sloppy teacher for SFT: with `teacher_carry_error=p` the demonstration of a
two-operand sum or difference that needs a carry or a borrow forgets it with
probability p (`25+17=` -> `32`, `23-7=` -> `26`, `7-23=` -> `-26`): it adds or
subtracts column by column and keeps each column's last digit. Records and their
`answer` (what the rewards check) stay exact; only the SFT targets are wrong. A model
trained on them errs on carries like its teacher, yet often samples the right answer,
which is what RL with the exact-match reward can sharpen (the demo's warm start).
"""
import functools
import random
import re
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


def _check_options(min_operands, max_operands, max_value, operators, teacher_carry_error):
  if not 1 <= min_operands <= max_operands:
    raise ValueError(f"arithmetic: need 1 <= min_operands <= max_operands, got "
                     f"{min_operands}, {max_operands}.")
  if max_value < 1:
    raise ValueError(f"arithmetic: max_value must be >= 1, got {max_value}.")
  if not operators or set(operators) - set(OPERATORS):
    raise ValueError(f"arithmetic: operators must be drawn from {OPERATORS!r}, "
                     f"got {operators!r}.")
  if not 0.0 <= teacher_carry_error <= 1.0:  # also rejects NaN
    raise ValueError(f"arithmetic: teacher_carry_error is a probability in [0, 1], "
                     f"got {teacher_carry_error!r}.")


def load_split(split: str, *, seed: int = 0, num_train: int = 100_000,
               num_eval: int = 500, min_operands: int = 2, max_operands: int = 3,
               max_value: int = 20, operators: str = OPERATORS,
               teacher_carry_error: float = 0.0) -> Sequence[dict]:
  """The 'train' or 'eval' split; see `tasks.base` for how splits are drawn.

  Args:
    split: 'train' or 'eval' (disjoint prompts).
    seed: the splits' seed.
    num_train: train records (drawn on demand, so a large number costs nothing).
    num_eval: eval records, all distinct.
    min_operands, max_operands, max_value, operators: difficulty.
    teacher_carry_error: how often a demonstration forgets a needed carry or borrow
      (see the module docstring); checked here, used only by `demonstration`.

  Returns:
    A sequence of records `{'prompt': str, 'answer': int}`.
  """
  _check_options(min_operands, max_operands, max_value, operators, teacher_carry_error)
  make = functools.partial(make_problem, min_operands=min_operands,
                           max_operands=max_operands, max_value=max_value,
                           operators=operators)
  return base.make_split(make, task="arithmetic", split=split, seed=seed,
                         num_train=num_train, num_eval=num_eval)


_TWO_OPERANDS = re.compile(r"(\d+)([+-])(\d+)=")


def _without_carries(a: int, b: int, op: str) -> int:
  """`a op b` column by column, each column's last digit kept: carries/borrows forgotten."""
  big, small, sign = (a, b, 1) if op == "+" or a >= b else (b, a, -1)
  value, place = 0, 1
  while big or small:
    column = big % 10 + small % 10 if op == "+" else big % 10 - small % 10
    value += (column % 10) * place
    big, small, place = big // 10, small // 10, place * 10
  return sign * value


def demonstration(record: dict, rng: random.Random | None = None, *,
                  teacher_carry_error: float = 0.0) -> str:
  """The target completion: the answer's digits (the trainer appends EOS).

  Args:
    record: an arithmetic record.
    rng: draws whether a sloppy teacher errs here; needed when teacher_carry_error > 0.
    teacher_carry_error: the chance that a two-operand sum or difference that needs a
      carry or borrow is demonstrated without it (the module docstring).
  """
  answer = record["answer"]
  match = _TWO_OPERANDS.fullmatch(record["prompt"])
  if teacher_carry_error > 0 and match:
    sloppy = _without_carries(int(match[1]), int(match[3]), match[2])
    if sloppy != answer and rng.random() < teacher_carry_error:
      return str(sloppy)
  return str(answer)


TASK = base.Task(load_split=load_split, demonstration=demonstration,
                 **base.exact_and_format_rewards("arithmetic"),
                 teacher_options=("teacher_carry_error",))
