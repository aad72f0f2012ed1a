"""The answer of a completion, for maj@K's vote (`pass_at_k.majority_correct`).

An extractor is a function `completion -> answer string, or None` (no answer). A run
names its own by import path in `config.eval.answer_extractor`; '' takes the task's own,
chosen by the module of the source's first reward function (the task's accuracy):
arithmetic's and the calculator's first-line integer, GSM8K's marked final answer
(`#### X` or `\\boxed{X}`, as an exact fraction), countdown's expression; any other
reward: the completion's last non-empty line, stripped.
"""
from __future__ import annotations

from typing import Callable

from jaxrl_llm import import_path
from jaxrl_llm.rewards import arithmetic, countdown, gsm8k

Extractor = Callable[[str], "str | None"]


def last_line(completion: str) -> str | None:
  """The last non-empty line, stripped (None for an empty completion)."""
  lines = [line.strip() for line in completion.splitlines() if line.strip()]
  return lines[-1] if lines else None


def integer_answer(completion: str) -> str | None:
  """Arithmetic's (and the calculator's) answer: the first line's integer."""
  value = arithmetic.parse_answer(completion)
  return None if value is None else str(value)


def gsm8k_answer(completion: str) -> str | None:
  """GSM8K's marked final answer as an exact fraction ('7', '7/2'), so `7.0` and `7` agree."""
  value = gsm8k.extract_answer(completion)
  return None if value is None else str(value)


def countdown_answer(completion: str) -> str | None:
  """Countdown's expression (its first line up to any `=`)."""
  return countdown.answer_expression(completion) or None


# The module of a source's first reward function -> its task's extractor.
BUILT_IN = {
    "jaxrl_llm.rewards.arithmetic": integer_answer,
    "jaxrl_llm.rewards.calculator": integer_answer,
    "jaxrl_llm.rewards.gsm8k": gsm8k_answer,
    "jaxrl_llm.rewards.countdown": countdown_answer,
}


def extractor_for(spec: str, reward_functions, field: str = "config.eval.answer_extractor"
                  ) -> Extractor:
  """`spec` (an import path) loaded, or with '' the built-in of the first of
  `reward_functions` (a source's `rewards.functions`), else `last_line`."""
  if spec:
    return import_path.load_function(spec, field)
  first = str(reward_functions[0]) if len(reward_functions) else ""
  return BUILT_IN.get(first.rpartition(":")[0], last_line)


def extract(extractor: Extractor, completion: str, field: str = "config.eval.answer_extractor"
            ) -> str | None:
  """`extractor(completion)` as a string or None; anything else is refused, naming `field`."""
  answer = extractor(completion)
  if answer is not None and not isinstance(answer, str):
    raise TypeError(f"{field}: the extractor returned {type(answer).__name__} "
                    f"{answer!r} for {completion[:80]!r}: expected a str or None")
  return answer
