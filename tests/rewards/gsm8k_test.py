"""GSM8K-style answer extraction (`#### x`, `\\boxed{x}`) and its rewards."""
import fractions

from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm.rewards import gsm8k

F = fractions.Fraction


class ExtractAnswerTest(parameterized.TestCase):

  @parameterized.parameters(
      ("She sold 48/2 = 24 clips.\n#### 72", F(72)),
      ("#### 1,234", F(1234)),
      ("#### 1,234,567.50", F(123456750, 100)),
      ("#### -7", F(-7)),
      ("#### $18.", F(18)),
      ("#### -$5", F(-5)),
      ("#### $-5", F(-5)),
      ("#### 3.50", F(7, 2)),
      ("#### .5", F(1, 2)),
      ("#### The answer is 42 apples", F(42)),
      ("So the total is \\boxed{42}.", F(42)),
      ("\\boxed{\\$1,234}", F(1234)),
      ("\\boxed{\\frac{3}{4}}", F(3, 4)),
      ("\\boxed{-\\frac{3}{4}}", F(-3, 4)),
      ("\\boxed{\\dfrac{1}{2}}", F(1, 2)),
      ("\\boxed{3/4}", F(3, 4)),
      ("\\boxed{42 \\text{ apples}}", F(42)),
      ("\\boxed{1{,}000}", F(1000)),
      ("\\fbox{9}", F(9)),
      ("first \\boxed{1} then \\boxed{2}", F(2)),  # the last box
      ("\\boxed{1}\n#### 2", F(2)),  # whichever is marked last
      ("#### 2\nactually \\boxed{3}", F(3)),
  )
  def test_extracts(self, text, expected):
    self.assertEqual(gsm8k.extract_answer(text), expected)

  @parameterized.parameters(
      "The answer is 42.",  # no marker: no answer
      "####",
      "#### none",
      "\\boxed{}",
      "\\boxed{x}",
      "\\boxed{1/0}",
      "#### " + "9" * 100,  # not a plausible answer
      "\\boxed{" + "(" * 10_000,  # unclosed, long
      "",
  )
  def test_no_answer(self, text):
    self.assertIsNone(gsm8k.extract_answer(text))

  @parameterized.parameters(
      (42, F(42)), (3.5, F(7, 2)), (0.1, F(1, 10)), ("42", F(42)), ("1,234", F(1234)),
      ("Natalia sold 48 clips ... #### 72", F(72)), ("\\boxed{7}", F(7)),
      ("$3.50", F(7, 2)))
  def test_reference_answer(self, answer, expected):
    self.assertEqual(gsm8k.reference_answer(answer), expected)


class Gsm8kRewardTest(parameterized.TestCase):

  @parameterized.parameters(
      ("... so she has 72 clips.\n#### 72", "He sold 48 ... #### 72", 1.0),
      ("#### 72.00", "72", 1.0),  # 72.00 == 72
      ("#### 3.5", "#### 3.50", 1.0),
      ("\\boxed{1,234}", 1234, 1.0),
      ("#### -4", "-4", 1.0),
      ("#### 73", "#### 72", 0.0),
      ("The answer is 72", "72", 0.0),  # not marked
      ("#### 4", "-4", 0.0),
      ("", "72", 0.0),
  )
  def test_exact(self, completion, answer, expected):
    self.assertEqual(gsm8k.gsm8k_exact(["q"], [completion], [answer]), [expected])

  def test_reference_without_a_number_raises(self):
    with self.assertRaisesRegex(ValueError, "holds no number"):
      gsm8k.gsm8k_exact(["q"], ["#### 1"], ["no answer here"])

  def test_format(self):
    self.assertEqual(
        gsm8k.gsm8k_format(["q"] * 4, ["#### 5", "\\boxed{2}", "5", "#### five"]),
        [1.0, 1.0, 0.0, 0.0])


if __name__ == "__main__":
  absltest.main()
