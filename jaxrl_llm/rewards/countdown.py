"""Countdown: reach a target from given numbers, each used at most once.

A completion answers with an expression on its first line, e.g. `(25-3)*4+12`;
anything after an `=` on that line (a restated result such as `=100`) is
ignored. The expression may use integer literals, `+ - * /` and parentheses
only; it is evaluated by `expression.evaluate` (no `eval`, exact fractions,
hard limits), so hostile text is simply a wrong answer.

Reward functions (dataset fields `numbers: list[int]`, `target: int`):
  countdown_exact   1.0 if the expression uses a sub-multiset of `numbers` and
                    equals `target` exactly, else 0.0.
  countdown_format  1.0 if the first line is a well-formed expression that
                    evaluates (whatever its numbers and value), else 0.0.
"""
import collections
from typing import Sequence

from jaxrl_llm.rewards import expression


def answer_expression(completion: str) -> str:
  """The expression part of a completion: its first line, up to any `=`."""
  # Linear-time string scans only; `evaluate` rejects an over-long result at once.
  line = completion.partition("\n")[0]
  return line.partition("=")[0].strip()


def check_solution(text: str, numbers: Sequence[int], target: int) -> bool:
  """True iff `text` uses each of `numbers` at most once and equals `target`."""
  try:
    result = expression.evaluate(text)
  except expression.ExpressionError:
    return False
  available = collections.Counter(int(n) for n in numbers)
  used = collections.Counter(result.numbers)
  if any(used[n] > available[n] for n in used):
    return False
  return result.value == int(target)


def countdown_exact(prompts: list[str], completions: list[str], numbers: list,
                    target: list, **unused_fields) -> list[float]:
  """1.0 where the completion's expression reaches `target` with `numbers`."""
  del prompts, unused_fields
  return [float(check_solution(answer_expression(c), n, t))
          for c, n, t in zip(completions, numbers, target, strict=True)]


def countdown_format(prompts: list[str], completions: list[str],
                     **unused_fields) -> list[float]:
  """1.0 where the completion's first line is a well-formed expression."""
  del prompts, unused_fields
  rewards = []
  for completion in completions:
    try:
      expression.evaluate(answer_expression(completion))
      rewards.append(1.0)
    except expression.ExpressionError:
      rewards.append(0.0)
  return rewards
