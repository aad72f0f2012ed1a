"""Rewards for the built-in `arithmetic` task (`jaxrl_llm/tasks/arithmetic.py`).

The task's prompt is the expression and an `=`, e.g. `12+7*3=`, and the expected
completion is the integer alone, e.g. `33`, then end-of-sequence. Completions
arrive decoded, with special tokens removed.

Reward functions (dataset field `answer`: an int, or a string holding one):
  arithmetic_exact   1.0 if the completion's first line, stripped of spaces, is
                     exactly the answer's integer (`33`, `-9`), else 0.0.
                     `33.0`, `+33`, `033`, `33 apples` and an empty line get 0.
  arithmetic_format  1.0 if the whole completion, stripped, is one integer in
                     that format (whatever its value), else 0.0: it rewards
                     stopping right after the answer.
"""
import re

_INTEGER = re.compile(r"-?(?:0|[1-9]\d{0,30})")


def parse_answer(completion: str) -> int | None:
  """The integer on the completion's first line, or None if it holds anything else."""
  line = completion.partition("\n")[0].strip()
  if not _INTEGER.fullmatch(line):
    return None
  return int(line)


def arithmetic_exact(prompts: list[str], completions: list[str], answer: list,
                     **unused_fields) -> list[float]:
  """1.0 where the completion's first line is exactly the integer `answer`."""
  del prompts, unused_fields
  rewards = []
  for completion, expected in zip(completions, answer, strict=True):
    got = parse_answer(completion)
    rewards.append(float(got is not None and got == int(expected)))
  return rewards


def arithmetic_format(prompts: list[str], completions: list[str],
                      **unused_fields) -> list[float]:
  """1.0 where the completion is a single integer and nothing else."""
  del prompts, unused_fields
  return [float(_INTEGER.fullmatch(c.strip()) is not None) for c in completions]
