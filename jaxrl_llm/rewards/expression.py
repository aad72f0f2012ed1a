"""Safe evaluation of small arithmetic expressions over integers.

Verifiers evaluate text a model wrote, so nothing here uses `eval`, `exec` or
`ast`: a tokenizer accepts only decimal integer literals, `+ - * /`, parentheses
and spaces, and a recursive-descent parser evaluates them with exact rational
arithmetic (`fractions.Fraction`). Hard limits bound the work any input can
cause: its length, the digits in one literal, the number of literals and the
parenthesis depth. With no exponent operator and bounded literals, every value
stays small; anything outside the grammar or the limits raises
`ExpressionError`, and so does division by zero.

Grammar (precedence as in Python, left-associative):

  expr   := term (('+' | '-') term)*
  term   := factor (('*' | '/') factor)*
  factor := INTEGER | '(' expr ')' | '-' factor      # unary minus only if allowed
"""
import dataclasses
import fractions
import re

MAX_CHARS = 256  # longest expression text accepted
MAX_DEPTH = 16  # deepest parenthesis (and unary minus) nesting
MAX_DIGITS = 12  # longest integer literal
MAX_NUMBERS = 32  # most integer literals in one expression

_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")


class ExpressionError(ValueError):
  """The text is not a valid, bounded expression, or divides by zero."""


@dataclasses.dataclass(frozen=True)
class Evaluated:
  """An evaluated expression.

  Attributes:
    value: the exact value.
    numbers: the integer literals, in the order they appear.
  """
  value: fractions.Fraction
  numbers: tuple[int, ...]


def _tokenize(text: str, max_digits: int, max_numbers: int) -> list[str | int]:
  """Splits `text` into ints and one-character operator strings."""
  tokens, count, pos = [], 0, 0
  text = text.strip()  # the token pattern skips the spaces between tokens
  while pos < len(text):
    match = _TOKEN.match(text, pos)
    if match is None:
      raise ExpressionError(f"unexpected character {text[pos]!r} at position {pos}")
    digits, op = match.groups()
    if digits is not None:
      if len(digits) > max_digits:
        raise ExpressionError(f"integer literal longer than {max_digits} digits")
      count += 1
      if count > max_numbers:
        raise ExpressionError(f"more than {max_numbers} numbers")
      tokens.append(int(digits))
    else:
      tokens.append(op)
    pos = match.end()
  return tokens


class _Parser:
  """Recursive-descent evaluator over a token list."""

  def __init__(self, tokens, max_depth: int, unary_minus: bool):
    self.tokens = tokens
    self.pos = 0
    self.depth = 0
    self.max_depth = max_depth
    self.unary_minus = unary_minus

  def _peek(self):
    return self.tokens[self.pos] if self.pos < len(self.tokens) else None

  def _take(self):
    token = self._peek()
    self.pos += 1
    return token

  def _enter(self):
    self.depth += 1
    if self.depth > self.max_depth:
      raise ExpressionError(f"nested deeper than {self.max_depth} levels")

  def expr(self) -> fractions.Fraction:
    value = self.term()
    while self._peek() in ("+", "-"):
      op = self._take()
      rhs = self.term()
      value = value + rhs if op == "+" else value - rhs
    return value

  def term(self) -> fractions.Fraction:
    value = self.factor()
    while self._peek() in ("*", "/"):
      op = self._take()
      rhs = self.factor()
      if op == "*":
        value = value * rhs
      elif rhs == 0:
        raise ExpressionError("division by zero")
      else:
        value = value / rhs
    return value

  def factor(self) -> fractions.Fraction:
    token = self._take()
    if isinstance(token, int):
      return fractions.Fraction(token)
    if token == "(":
      self._enter()
      value = self.expr()
      if self._take() != ")":
        raise ExpressionError("missing ')'")
      self.depth -= 1
      return value
    if token == "-" and self.unary_minus:
      self._enter()
      value = -self.factor()
      self.depth -= 1
      return value
    if token is None:
      raise ExpressionError("unexpected end of expression")
    raise ExpressionError(f"unexpected {token!r}")


def evaluate(text: str, *, unary_minus: bool = False, max_chars: int = MAX_CHARS,
             max_depth: int = MAX_DEPTH, max_digits: int = MAX_DIGITS,
             max_numbers: int = MAX_NUMBERS) -> Evaluated:
  """Evaluates an integer expression exactly, within hard limits.

  Args:
    text: e.g. `"(25 - 3) * 4 / 2"`.
    unary_minus: accept a leading `-` on a factor (`"-3+5"`). Off by default:
      puzzles such as countdown allow only the binary operators.
    max_chars, max_depth, max_digits, max_numbers: the limits described in the
      module docstring.

  Returns:
    The exact value and the integer literals used.

  Raises:
    ExpressionError: anything outside the grammar or the limits, or a division
      by zero.
  """
  if not isinstance(text, str):
    raise ExpressionError(f"expected a string, got {type(text).__name__}")
  if len(text) > max_chars:
    raise ExpressionError(f"longer than {max_chars} characters")
  tokens = _tokenize(text, max_digits, max_numbers)
  if not tokens:
    raise ExpressionError("empty expression")
  parser = _Parser(tokens, max_depth, unary_minus)
  value = parser.expr()
  if parser.pos != len(tokens):
    raise ExpressionError(f"unexpected {tokens[parser.pos]!r} after a complete expression")
  numbers = tuple(t for t in tokens if isinstance(t, int))
  return Evaluated(value=value, numbers=numbers)
