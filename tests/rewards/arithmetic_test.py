"""Arithmetic rewards: exact match on the first line, and the format reward."""
from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm.rewards import arithmetic


class ArithmeticRewardTest(parameterized.TestCase):

  @parameterized.parameters(
      ("33", 33, 1.0),
      (" 33 ", 33, 1.0),
      ("33\n12+1=13", 33, 1.0),  # only the first line is the answer
      ("-9", -9, 1.0),
      ("0", 0, 1.0),
      ("33", "33", 1.0),  # a string answer field (JSONL)
      ("34", 33, 0.0),
      ("-33", 33, 0.0),
      ("33.0", 33, 0.0),
      ("+33", 33, 0.0),
      ("033", 33, 0.0),
      ("33 apples", 33, 0.0),
      ("3 3", 33, 0.0),
      ("", 33, 0.0),
      ("\n33", 33, 0.0),
      ("x" * 1_000_000, 33, 0.0),
  )
  def test_exact(self, completion, answer, expected):
    self.assertEqual(arithmetic.arithmetic_exact(["12+7*3="], [completion], [answer]),
                     [expected])

  def test_exact_batch_and_extra_fields(self):
    self.assertEqual(
        arithmetic.arithmetic_exact(["a", "b", "c"], ["1", "2", "x"], [1, 3, 0],
                                    solution=["", "", ""]),
        [1.0, 0.0, 0.0])

  @parameterized.parameters(
      ("33", 1.0), ("-9", 1.0), (" 7 ", 1.0),
      ("33\n", 1.0),  # trailing whitespace is not extra text
      ("33\n12", 0.0), ("33=", 0.0), ("abc", 0.0), ("", 0.0), ("1.5", 0.0))
  def test_format(self, completion, expected):
    self.assertEqual(arithmetic.arithmetic_format([""], [completion]), [expected])


if __name__ == "__main__":
  absltest.main()
