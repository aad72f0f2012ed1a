r"""The child process behind `jaxrl_llm.rewards.math`: math-verify's `parse` and `verify`.

  python -m jaxrl_llm.rewards.math_worker   # started by jaxrl_llm.rewards.math, not by hand

It prints `ready` once math-verify has imported, then reads one JSON request per line,
`[reference, answer, marked]`, and answers each with one line: `1` (equivalent), `0` (not,
or no answer found) or `?` (the reference holds no answer math-verify can parse).

`reference` and, when `marked` is true, `answer` are final answers on their own (a
reference, or the text after a completion's `####`): `parse_marked` reads them as plain
text (`42`, `1,234`, `$18.`) or as LaTeX (`2\sqrt{2}`, `\{1,2\}`, `[1,2)`). Otherwise `answer`
is a whole completion, and math-verify finds its final answer (`parse_completion`).

Timeouts are off (`parsing_timeout=None`, `timeout_seconds=None`): math-verify's own use
`signal.alarm`, which raises ValueError off the main thread; the parent process bounds each
request instead and kills this process when one runs too long (`9^{9^{9^{9}}}`).
"""
import functools
import json
import logging
import os
import re
import sys

import math_verify
from math_verify import ExprExtractionConfig, LatexExtractionConfig

# References and `####` lines are the answer: read any number or LaTeX in them.
MARKED = (LatexExtractionConfig(), ExprExtractionConfig())
# A completion's answer needs an anchor: \boxed{}, "final answer is", "answer:" (as open-r1's
# accuracy reward). Without one, math-verify would take the last number of any text, such
# as a truncated completion's last step.
COMPLETION = (LatexExtractionConfig(try_extract_without_anchor=False),
              ExprExtractionConfig(try_extract_without_anchor=False))
_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")


def _parse(text: str, config) -> list:
  return math_verify.parse(text, extraction_config=config, parsing_timeout=None)


def _parsed(result: list) -> bool:
  """Whether math-verify understood something (not only its fallback string)."""
  return any(not isinstance(r, str) for r in result)


def _plain_first(text: str) -> bool:
  """Whether to read `text` as it is before reading it as LaTeX: it has math delimiters,
  or words (`72 apples`; as LaTeX, a product of letters)."""
  return (any(d in text for d in _DELIMITERS)
          or re.search(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+", "", text)) is not None)


@functools.lru_cache(maxsize=4096)  # a reference repeats for each of its G samples
def parse_marked(text: str) -> tuple:
  r"""A final answer on its own, read as LaTeX (`\boxed{TEXT}`: `2\sqrt{2}`, `[1, 2)`; as
  plain text both would be 2) or, first when it has words or math delimiters, as it is
  (`72 apples`, `$\frac{1}{2}$`, `$18.`); then the other way. () when neither parses."""
  boxed = "\\boxed{" + text + "}"
  for attempt in ((text, boxed) if _plain_first(text) else (boxed, text)):
    result = _parse(attempt, MARKED)
    if _parsed(result):
      return tuple(result)
  return ()


def parse_completion(text: str) -> list:
  """A completion's final answer, found by math-verify ([] when none is marked)."""
  return _parse(text, COMPLETION)


def verdict(reference: str, answer: str, marked: bool) -> str:
  """'1' when `answer` is equivalent to `reference`, '0' when not, '?' when the reference
  does not parse."""
  gold = parse_marked(reference)
  if not gold:
    return "?"
  try:
    got = parse_marked(answer) if marked else parse_completion(answer)
    return "1" if got and math_verify.verify(list(gold), list(got), timeout_seconds=None) else "0"
  except Exception:  # pylint: disable=broad-except -- junk text scores 0, never stops a run
    return "0"


def main() -> None:
  """Serves requests from stdin until it closes (the parent exited)."""
  replies = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)  # whatever else prints (sympy, antlr) goes to stderr, not into the replies
  # "Timeout is disabled ...": the parent bounds each request.
  logging.getLogger("math_verify").setLevel(logging.ERROR)
  replies.write("ready\n")
  for line in sys.stdin:
    reference, answer, marked = json.loads(line)
    replies.write(verdict(reference, answer, marked) + "\n")


if __name__ == "__main__":
  main()
