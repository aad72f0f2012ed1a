"""GSM8K-style final answers: `#### 42` and `\\boxed{42}`.

`extract_answer` finds a text's final answer: the one marked last, either after
the last `####` (GSM8K's solutions) or inside the last `\\boxed{...}` (MATH and
most chat models). Numbers are compared exactly as fractions, after removing
`$` signs, thousands separators (`1,234`) and trailing zeros (`3.50` == `3.5`);
negatives, decimals, `a/b` and `\\frac{a}{b}` inside a box are understood.

Reward functions (dataset field `answer`: a number, a bare number string such
as `"42"`, or a full GSM8K solution ending in `#### 42`):
  gsm8k_exact   1.0 if the completion's final answer equals the reference
                answer, else 0.0 (also 0.0 when the completion marks no answer).
  gsm8k_format  1.0 if the completion marks a final answer that parses as a
                number, else 0.0.
"""
import fractions
import numbers
import re

MAX_NUMBER_CHARS = 40  # longer "numbers" are not answers; bounds Fraction work
MAX_BOX_CHARS = 1000  # a box's content is read this far at most

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|-?\.\d+")
_FRAC = re.compile(r"(-?)\\d?frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}")
_SLASH = re.compile(r"(-?)(\d+)\s*/\s*(\d+)")
_BOXED = ("\\boxed{", "\\fbox{")


def _clean(text: str) -> str:
  """Drops the decorations around numbers: `$`, `\\$`, `{,}`, `\\!`, `\\,`."""
  for junk, repl in (("\\$", ""), ("$", ""), ("{,}", ","), ("\\!", ""), ("\\,", "")):
    text = text.replace(junk, repl)
  return re.sub(r"-\s+(?=[\d.])", "-", text)  # "- 5" -> "-5"


def parse_number(text: str) -> fractions.Fraction | None:
  """The first number in `text` as an exact fraction, or None if there is none."""
  text = _clean(text)
  match = _FRAC.search(text) or _SLASH.search(text)
  first = _NUMBER.search(text)
  if match and (first is None or match.start() <= first.start()):
    sign, num, den = match.group(1), int(match.group(2)), int(match.group(3))
    if den == 0 or max(len(match.group(2)), len(match.group(3))) > MAX_NUMBER_CHARS:
      return None
    return fractions.Fraction(-num if sign else num, den)
  if first is None or len(first.group()) > MAX_NUMBER_CHARS:
    return None
  return fractions.Fraction(first.group().replace(",", ""))


def _boxed_content(text: str, start: int) -> str:
  """The text inside the braces opening at `start`, braces balanced."""
  depth = 0
  for i in range(start, min(len(text), start + MAX_BOX_CHARS)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        return text[start + 1:i]
  return text[start + 1:start + MAX_BOX_CHARS]  # unclosed or too long


def extract_answer(text: str) -> fractions.Fraction | None:
  """The final answer a text marks with `#### X` or `\\boxed{X}`, or None."""
  hash_at = text.rfind("####")
  box_at, box_len = max((text.rfind(b), len(b)) for b in _BOXED)
  if hash_at < 0 and box_at < 0:
    return None
  if hash_at > box_at:
    tail = text[hash_at + 4:].partition("\n")[0]
    return parse_number(tail)
  return parse_number(_boxed_content(text, box_at + box_len - 1))


def reference_answer(answer) -> fractions.Fraction | None:
  """A dataset's `answer` field as a fraction: a number, `"42"` or `"... #### 42"`."""
  if isinstance(answer, numbers.Integral) and not isinstance(answer, bool):
    return fractions.Fraction(int(answer))
  if isinstance(answer, numbers.Real) and not isinstance(answer, bool):
    return fractions.Fraction(repr(float(answer)))  # 0.1 means 1/10, not its binary value
  answer = str(answer)
  marked = extract_answer(answer)
  return marked if marked is not None else parse_number(answer)


def gsm8k_exact(prompts: list[str], completions: list[str], answer: list,
                **unused_fields) -> list[float]:
  """1.0 where the completion's marked final answer equals the reference `answer`."""
  del prompts, unused_fields
  rewards = []
  for completion, reference in zip(completions, answer, strict=True):
    expected = reference_answer(reference)
    if expected is None:
      raise ValueError(f"reference answer {str(reference)[-80:]!r} holds no number")
    got = extract_answer(completion)
    rewards.append(float(got is not None and got == expected))
  return rewards


def gsm8k_format(prompts: list[str], completions: list[str],
                 **unused_fields) -> list[float]:
  """1.0 where the completion marks a final answer that parses as a number."""
  del prompts, unused_fields
  return [float(extract_answer(c) is not None) for c in completions]
