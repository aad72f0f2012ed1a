"""RewardSet: weighted totals, per-function values, and the errors bad functions get."""
import os
import re

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections
import numpy as np

from jaxrl_llm import import_path, rewards
from jaxrl_llm.rewards import arithmetic
from jaxrl_llm.rewards import reward_set as reward_set_lib

FAKE = "tests.rewards.fake_rewards:"
PROMPTS = ["1+1=", "2+2=", "3+3=", "4+4="]
COMPLETIONS = ["2", "4", "boom", "8" * 500]


class RewardSetTest(parameterized.TestCase):

  def test_weighted_total_and_per_function(self):
    reward_set = rewards.RewardSet(
        [FAKE + "length", FAKE + "matches_answer", FAKE + "numpy_values"], [0.5, 2.0, -1.0])
    out = reward_set(PROMPTS, COMPLETIONS, answer=["2", "5", "6", "8"])
    length = np.array([1, 1, 4, 500], np.float32)
    match = np.array([1, 0, 0, 0], np.float32)
    ramp = np.array([0, 0.5, 1, 1.5], np.float32)
    np.testing.assert_allclose(out.total, 0.5 * length + 2.0 * match - ramp)
    self.assertEqual(out.total.dtype, np.float32)
    self.assertEqual(out.total.shape, (4,))
    self.assertEqual(list(out.per_function), ["length", "matches_answer", "numpy_values"])
    np.testing.assert_array_equal(out.per_function["length"], length)
    np.testing.assert_array_equal(out.per_function["matches_answer"], match)
    means = out.means()
    self.assertAlmostEqual(means["reward/length"], 126.5)
    self.assertAlmostEqual(means["reward/matches_answer"], 0.25)
    self.assertAlmostEqual(means["reward/total"], float(out.total.mean()), places=4)

  def test_from_config_and_builtin_paths(self):
    cfg = ml_collections.ConfigDict({
        "functions": ("jaxrl_llm.rewards.arithmetic:arithmetic_exact",
                      "jaxrl_llm.rewards.arithmetic:arithmetic_format"),
        "weights": (1.0, 0.25)})
    out = rewards.RewardSet.from_config(cfg)(
        ["1+1=", "2*3=", "5-9="], ["2", "7", "-4 x"], answer=[2, 6, -4])
    np.testing.assert_allclose(out.total, [1.25, 0.25, 0.0])

  def test_file_path_function_and_unique_names(self):
    path = os.path.join(self.create_tempdir().full_path, "my_rewards.py")
    with open(path, "w") as f:
      f.write("def length(prompts, completions, **unused):\n"
              "  return [10.0] * len(completions)\n")
    reward_set = rewards.RewardSet([FAKE + "length", path + ":length"], [1.0, 1.0])
    self.assertEqual(reward_set.names, ("length", "length_2"))
    out = reward_set(["a"], ["xyz"])
    np.testing.assert_array_equal(out.per_function["length_2"], [10.0])
    np.testing.assert_array_equal(out.total, [13.0])

  @parameterized.parameters(
      dict(functions=(FAKE + "length",), weights=(), message="0 values for 1 functions"),
      dict(functions=(FAKE + "length",), weights=(1.0, 2.0), message="2 values for 1"),
      dict(functions=(FAKE + "length",), weights=(float("nan"),), message="not a finite"),
      dict(functions=(FAKE + "length",), weights=("1",), message="not a finite"),
  )
  def test_bad_config(self, functions, weights, message):
    with self.assertRaisesRegex(ValueError, message):
      rewards.RewardSet(functions, weights)

  def test_bad_import_path_names_the_field(self):
    with self.assertRaisesRegex(import_path.ImportPathError, re.escape(
        f"config.sources.a.rewards.functions[1]='{FAKE}no_such_fn': Import path "
        f"'{FAKE}no_such_fn': 'tests.rewards.fake_rewards' has no attribute 'no_such_fn'")):
      rewards.RewardSet([FAKE + "length", FAKE + "no_such_fn"], [1.0, 1.0],
                        field="config.sources.a.rewards")

  def test_no_functions_score_zero(self):
    """Where an environment or a teacher carries the signal."""
    out = rewards.RewardSet([], [])(PROMPTS, COMPLETIONS, answer=["2", "5", "6", "8"])
    np.testing.assert_array_equal(out.total, np.zeros(4, np.float32))
    self.assertEqual(out.per_function, {})
    self.assertEqual(out.means(), {"reward/total": 0.0})

  def test_fields_a_function_reads(self):
    def keyword_only(prompts, completions, *, answer, hint="", **unused):
      del prompts, completions, answer, hint, unused
    def no_extra_fields(p, c, answer, numbers=None):
      del p, c, answer, numbers
    self.assertEqual(reward_set_lib.fields_read(arithmetic.arithmetic_exact), (("answer",), None))
    self.assertEqual(reward_set_lib.fields_read(arithmetic.arithmetic_format), ((), None))
    self.assertEqual(reward_set_lib.fields_read(keyword_only), (("answer",), None))
    self.assertEqual(reward_set_lib.fields_read(no_extra_fields),
                     (("answer",), frozenset({"answer", "numbers"})))

  def test_missing_and_unexpected_fields(self):
    reward_set = rewards.RewardSet(
        ["jaxrl_llm.rewards.arithmetic:arithmetic_exact", FAKE + "length"], [1.0, 1.0])
    self.assertEqual(reward_set.missing_fields({"numbers"}),
                     [("jaxrl_llm.rewards.arithmetic:arithmetic_exact", "answer")])
    self.assertEqual(reward_set.missing_fields({"answer", "numbers"}), [])
    self.assertEqual(reward_set.unexpected_fields({"answer", "numbers"}), [])  # **fields

  def test_misaligned_inputs(self):
    reward_set = rewards.RewardSet([FAKE + "length"], [1.0])
    with self.assertRaisesRegex(ValueError, "2 prompts but 1 completions"):
      reward_set(["a", "b"], ["x"])
    with self.assertRaisesRegex(ValueError, "Field 'answer' has 1 values for 2"):
      reward_set(["a", "b"], ["x", "y"], answer=["1"])


class RewardErrorTest(parameterized.TestCase):

  def _error(self, name, completions=COMPLETIONS) -> str:
    reward_set = rewards.RewardSet([FAKE + name], [1.0])
    with self.assertRaises(rewards.RewardError) as caught:
      reward_set(PROMPTS, completions)
    message = str(caught.exception)
    self.assertIn(repr(FAKE + name), message)  # names the function by import path
    return message

  def test_raises_names_the_failing_sample(self):
    message = self._error("raises_on_boom")
    self.assertIn("KeyError", message)
    self.assertIn("no score for boom", message)
    self.assertIn("sample 2", message)
    self.assertIn("prompt='3+3='", message)
    self.assertIn("completion='boom'", message)
    self.assertNotIn("sample 0", message)

  def test_raises_only_on_the_whole_batch(self):
    message = self._error("raises_on_batches")
    self.assertIn("batch too large", message)
    self.assertIn("no single sample fails alone", message)

  def test_is_a_value_error_with_the_cause_chained(self):
    reward_set = rewards.RewardSet([FAKE + "raises_on_boom"], [1.0])
    with self.assertRaises(ValueError) as caught:
      reward_set(["p"], ["boom"])
    self.assertIsInstance(caught.exception.__cause__, KeyError)

  def test_too_few_values(self):
    message = self._error("drops_last")
    self.assertIn("returned 3 values for 4 samples", message)
    self.assertIn("sample 3", message)
    self.assertIn("prompt='4+4='", message)

  def test_too_many_values(self):
    self.assertIn("returned 5 values for 4 samples", self._error("one_too_many"))

  @parameterized.parameters(
      ("nan_on_second", "nan", "sample 1", "completion='4'"),
      ("inf_on_last", "-inf", "sample 3", "(500 characters)"),  # long text truncated
      ("float32_overflow", "1e+39", "sample 0", "prompt='1+1='"),
      ("string_value", "'1.0'", "sample 0", "completion='2'"),
      ("none_value", "None", "sample 0", "completion='2'"),
  )
  def test_unusable_values(self, name, value, sample, text):
    message = self._error(name)
    self.assertIn(f"returned {value} for {sample}", message)
    self.assertIn(text, message)
    self.assertIn("finite real numbers", message)

  def test_long_text_is_truncated_in_the_message(self):
    message = self._error("inf_on_last")
    self.assertLess(len(message), 1000)

  @parameterized.parameters(("returns_scalar", "float"), ("returns_string", "str"))
  def test_not_a_list(self, name, type_name):
    self.assertIn(f"returned a {type_name}, not a list of 4 floats", self._error(name))


if __name__ == "__main__":
  absltest.main()
