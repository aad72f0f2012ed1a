"""The safe expression evaluator: values, grammar, limits, hostile input."""
import fractions
import time

from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm.rewards import expression

F = fractions.Fraction


class EvaluateTest(parameterized.TestCase):

  @parameterized.parameters(
      ("12+7*3", 33, (12, 7, 3)),
      ("(12+7)*3", 57, (12, 7, 3)),
      ("10-4-3", 3, (10, 4, 3)),  # left-associative
      ("8/4/2", 1, (8, 4, 2)),
      ("7/2", F(7, 2), (7, 2)),  # exact, not 3 or 3.5
      ("1/3+1/3+1/3", 1, (1, 3, 1, 3, 1, 3)),
      (" ( 25 - 3 ) * 4 ", 88, (25, 3, 4)),
      ("0", 0, (0,)),
  )
  def test_values_and_numbers(self, text, value, numbers):
    result = expression.evaluate(text)
    self.assertEqual(result.value, value)
    self.assertIsInstance(result.value, F)
    self.assertEqual(result.numbers, numbers)

  def test_unary_minus_only_when_allowed(self):
    with self.assertRaisesRegex(expression.ExpressionError, "unexpected '-'"):
      expression.evaluate("-3+5")
    self.assertEqual(expression.evaluate("-3+5", unary_minus=True).value, 2)
    self.assertEqual(expression.evaluate("2*-(3-5)", unary_minus=True).value, 4)

  @parameterized.parameters(
      ("", "empty"),
      ("   ", "empty"),
      ("3+", "end of expression"),
      ("(3+4", "missing"),
      ("3+4)", "after a complete expression"),
      ("3 4", "after a complete expression"),
      ("2**3", "unexpected '\\*'"),
      ("9**9**9**9", "unexpected '\\*'"),
      ("3.5+1", "unexpected character '.'"),
      ("x+1", "unexpected character 'x'"),
      ("__import__('os').system('ls')", "unexpected character '_'"),
      ("().__class__", "unexpected character '.'"),
      ("1e9", "unexpected character 'e'"),
      ("abs(3)", "unexpected character 'a'"),
      ("5/0", "division by zero"),
      ("5/(3-3)", "division by zero"),
      ("1/(2/4-1/2)", "division by zero"),
  )
  def test_rejects(self, text, message):
    with self.assertRaisesRegex(expression.ExpressionError, message):
      expression.evaluate(text)

  def test_limits(self):
    with self.assertRaisesRegex(expression.ExpressionError, "16 levels"):
      expression.evaluate("(" * 17 + "1" + ")" * 17)
    self.assertEqual(expression.evaluate("(" * 16 + "1" + ")" * 16).value, 1)
    with self.assertRaisesRegex(expression.ExpressionError, "12 digits"):
      expression.evaluate("1" * 13)
    with self.assertRaisesRegex(expression.ExpressionError, "32 numbers"):
      expression.evaluate("+".join(["1"] * 33))
    with self.assertRaisesRegex(expression.ExpressionError, "256 characters"):
      expression.evaluate("1" + "+1" * 200)
    with self.assertRaisesRegex(expression.ExpressionError, "16 levels"):
      expression.evaluate("-" * 40 + "1", unary_minus=True)

  def test_hostile_inputs_fail_fast(self):
    hostile = ["(" * 100_000, "1+" * 5_000_000 + "1", "9" * 10_000_000,
               "((((" * 60 + "1"]
    start = time.perf_counter()
    for text in hostile:
      with self.assertRaises(expression.ExpressionError):
        expression.evaluate(text)
    self.assertLess(time.perf_counter() - start, 1.0)

  def test_not_a_string(self):
    with self.assertRaisesRegex(expression.ExpressionError, "expected a string"):
      expression.evaluate(12)


if __name__ == "__main__":
  absltest.main()
