"""The countdown verifier and its rewards: right, wrong, malformed and hostile answers."""
import time

from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm.rewards import countdown

NUMBERS = [3, 5, 8, 1]
TARGET = 24


def exact(*completions, numbers=NUMBERS, target=TARGET):
  n = len(completions)
  return countdown.countdown_exact([""] * n, list(completions), [numbers] * n, [target] * n)


class CheckSolutionTest(parameterized.TestCase):

  @parameterized.parameters(
      "8*3", "(5-3+1)*8", "3*8*1", "8*(5-3+1)", "8*3/1", "8/(1/3)",
      " 8 * 3 ", "8*3=24", "8*3\nsome explanation")
  def test_right(self, completion):
    self.assertEqual(exact(completion), [1.0])

  @parameterized.parameters(
      "8*3+1",  # wrong value
      "8*3*3",  # 3 used twice, though it equals 72 anyway
      "8*8-40",  # 8 twice, 40 not given
      "24",  # 24 is not one of the numbers
      "6*4",  # right value, numbers not given
      "(8-5)*8*1+0",  # 0 not given
      "5*5-1",  # right value with 5 twice
  )
  def test_wrong(self, completion):
    self.assertEqual(exact(completion), [0.0])

  def test_sub_multiset_allows_duplicates_that_are_given(self):
    self.assertEqual(exact("5*5-1", numbers=[5, 5, 1, 9]), [1.0])
    self.assertEqual(exact("5*5-1-0", numbers=[5, 5, 1, 9]), [0.0])

  def test_value_is_exact_rational(self):
    # 8/3*3 is 8 exactly; float arithmetic would give 7.999...; 1/3*3 must equal 1.
    self.assertEqual(exact("8/3*3", numbers=[8, 3, 3], target=8), [1.0])
    self.assertEqual(exact("7/2", numbers=[7, 2], target=3), [0.0])

  def test_string_fields_from_jsonl(self):
    self.assertEqual(countdown.countdown_exact([""], ["8*3"], [["3", "8"]], ["24"]), [1.0])

  @parameterized.parameters(
      "",
      "the answer is 8*3",
      "__import__('os').system('echo pwned')",
      "exec('8*3')",
      "eval('8*3')",
      "(8).__class__",
      "9**9**9**9",
      "8**1*3",
      "3 8 *",
      "8*3)",
      "((8*3)",
      "8/0*3",
      "8*3/(5-5)",
      "lambda: 24",
      "8 * 3.0",
      "0x18",
  )
  def test_malformed_and_hostile_get_zero(self, completion):
    self.assertEqual(exact(completion), [0.0])
    self.assertEqual(countdown.countdown_format([""], [completion], ), [0.0])

  def test_huge_inputs_are_fast(self):
    hostile = [
        "(" * 1_000_000 + "8*3" + ")" * 1_000_000,  # deep nesting
        "(" * 20 + "8*3" + ")" * 20,  # short but deeper than the limit
        "8*3+" + "1-1+" * 2_500_000 + "0",  # 10 MB one-liner
        "9" * 10_000_000,  # a 10-million-digit number
        "9" * 13 + "*0+8*3",  # a literal over the digit limit
    ]
    start = time.perf_counter()
    self.assertEqual(exact(*hostile), [0.0] * len(hostile))
    # Trailing spaces are not part of the answer: right, and just as fast.
    self.assertEqual(exact("8*3" + " " * 10_000_000), [1.0])
    self.assertLess(time.perf_counter() - start, 2.0)

  def test_format_rewards_well_formed_expressions_whatever_their_value(self):
    self.assertEqual(
        countdown.countdown_format(["", "", ""], ["8*3", "(1+2)*99", "8*"]),
        [1.0, 1.0, 0.0])


if __name__ == "__main__":
  absltest.main()
