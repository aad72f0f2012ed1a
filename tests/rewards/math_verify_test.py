r"""`jaxrl_llm.rewards.math:math_verify` (math-verify's equivalence), and how it compares with
`gsm8k_exact` on GSM8K-style completions: the same verdicts where gsm8k reads an answer,
except for the cases in `DIFFERENCES`."""
import os
import subprocess
import sys
import threading
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm.rewards import gsm8k
from jaxrl_llm.rewards import math as math_rewards

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def score(completion, reference) -> float:
  return math_rewards.math_verify(["q"], [completion], [reference])[0]


# (completion, reference): GSM8K-style, where both rewards read an answer and agree. The
# completions are tests/rewards/gsm8k_test.py's, plus a few with text after the answer.
AGREE = (
    ("She sold 48/2 = 24 clips.\n#### 72", "He sold 48 ... #### 72"),
    ("#### 1,234", "1234"),
    ("#### 1234", "#### 1,234"),
    ("#### 1,234,567.50", "1234567.5"),
    ("#### -7", -7),
    ("#### $18.", "#### 18"),
    ("#### -$5", "-5"),
    ("#### $-5", "-5"),
    ("#### 3.50", "3.5"),
    ("#### .5", "0.5"),
    ("#### 0.1", 0.1),
    ("#### 72.00", "72"),
    ("#### 3.5", "#### 3.50"),
    ("#### The answer is 42 apples", 42),
    ("#### 72 apples (3 bags)", 72),
    ("#### 72\nI hope it helps, 3 times", 72),  # the #### line, not the last number
    ("So the total is \\boxed{42}.", "42"),
    ("$\\boxed{18}$ dollars", "$18"),
    ("\\boxed{\\$1,234}", "#### 1,234"),
    ("\\boxed{1,234}", 1234),
    ("\\boxed{\\$18.00}", "18"),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("\\boxed{-\\frac{3}{4}}", "-0.75"),
    ("\\boxed{\\dfrac{1}{2}}", 0.5),
    ("\\boxed{3/4}", "3/4"),
    ("\\boxed{42 \\text{ apples}}", 42),
    ("\\boxed{1{,}000}", 1000),
    ("\\fbox{9}", 9),
    ("\\boxed{1}\n#### 2", 2),  # whichever is marked last
    ("#### 2\nactually \\boxed{3}", 3),
    ("#### -4", "-4"),
    ("#### 73", "#### 72"),  # wrong answers
    ("#### 4", "-4"),
    ("\\boxed{41}", 42),
)

# (completion, reference, gsm8k_exact, math_verify, why they differ)
DIFFERENCES = (
    ("The answer is 72", "72", 0.0, 1.0,
     "no #### or box: gsm8k reads no answer; math-verify's 'answer' anchor reads 72"),
    ("The final answer is $72$.", 72, 0.0, 1.0, "the same, with math-verify's 'final answer is'"),
    ("first \\boxed{1} then \\boxed{2}", 2, 1.0, 0.0,
     "several boxes: gsm8k takes the last, math-verify the set {1, 2}"),
    ("\\boxed{72", 72, 1.0, 0.0, "an unclosed box: gsm8k reads it, math-verify does not"),
    ("\\boxed{0.333333}", "\\frac{1}{3}", 0.0, 1.0,
     "math-verify compares numbers to 6 decimals, gsm8k exactly"),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 0.0, 1.0,
     "a symbolic answer: gsm8k reads the first number (8 and 2)"),
    ("\\boxed{2 + 3}", 5, 0.0, 1.0, "an expression: gsm8k reads 2, math-verify 5"),
    ("\\boxed{50\\%}", "0.5", 0.0, 1.0, "math-verify takes 50% as 0.5, gsm8k as 50"),
)


class ComparedWithGsm8kTest(parameterized.TestCase):

  def test_agrees_where_gsm8k_reads_an_answer(self):
    completions, references = zip(*AGREE)
    for completion in completions:  # else the case belongs in DIFFERENCES
      self.assertIsNotNone(gsm8k.extract_answer(completion), completion)
    prompts = ["q"] * len(AGREE)
    expected = gsm8k.gsm8k_exact(prompts, list(completions), list(references))
    self.assertEqual(math_rewards.math_verify(prompts, list(completions), list(references)),
                     expected)
    self.assertIn(0.0, expected)  # the table holds wrong answers too
    self.assertIn(1.0, expected)

  @parameterized.parameters(*DIFFERENCES)
  def test_differences(self, completion, reference, by_gsm8k, by_math_verify, why):
    self.assertEqual(gsm8k.gsm8k_exact(["q"], [completion], [reference]), [by_gsm8k], why)
    self.assertEqual(score(completion, reference), by_math_verify, why)


class MathVerifyTest(parameterized.TestCase):

  @parameterized.parameters(
      ("\\boxed{42}", 42, 1.0),
      ("The final answer is $\\boxed{-7}$.", "-7", 1.0),
      ("\\boxed{43}", 42, 0.0),
      ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),  # fractions and decimals
      ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
      ("\\boxed{0.5}", "$\\frac{1}{2}$", 1.0),  # a reference in math delimiters
      ("\\boxed{0.6}", "\\frac{1}{2}", 0.0),
      ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),  # equivalent expressions
      ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
      ("\\boxed{\\sqrt{6}}", "2\\sqrt{2}", 0.0),
      ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
      ("\\boxed{\\{3,2,1\\}}", "\\{1,2,3\\}", 1.0),  # sets
      ("\\boxed{\\{1,2\\}}", "\\{1,2,3\\}", 0.0),
      ("\\boxed{[1,2)}", "[1, 2)", 1.0),  # intervals
      ("\\boxed{(1,2)}", "[1, 2)", 0.0),
      ("So $\\boxed{\\pi/2}$.", "\\frac{\\pi}{2}", 1.0),
      ("A full MATH solution ... $\\boxed{12}$", "Work ... so $\\boxed{12}$.", 1.0),
  )
  def test_math_answers(self, completion, reference, expected):
    self.assertEqual(score(completion, reference), expected)

  @parameterized.parameters(
      "", "   ", "####", "#### none", "\\boxed{}", "\\boxed{x}", "\\boxed{1/0}",
      "The sum is 42",  # no anchor: not an answer
      "\\boxed{" * 5000, "$" * 20000, "\\boxed{" + "(" * 10_000, "\x00\x01 \udcff \\frac{{}",
      "%$#@!" * 2000)
  def test_no_or_junk_answer_scores_0(self, completion):
    self.assertEqual(score(completion, "42"), 0.0)

  @parameterized.parameters("", "####", "  \n#### ")
  def test_reference_without_an_answer_raises(self, reference):
    with self.assertRaisesRegex(ValueError, "holds no answer math-verify can parse"):
      score("\\boxed{1}", reference)

  def test_reference_text(self):
    self.assertEqual([math_rewards.reference_text(a) for a in
                      (42, 3.5, 1e-05, "Natalia ... #### 1,234\n", " \\frac{1}{2} ")],
                     ["42", "3.5", "0.00001", "1,234", "\\frac{1}{2}"])

  def test_deterministic(self):
    completions = [c for c, _ in AGREE] + [c for c, *_ in DIFFERENCES]
    references = [r for _, r in AGREE] + [r for _, r, *_ in DIFFERENCES]
    prompts = ["q"] * len(completions)
    first = math_rewards.math_verify(prompts, completions, references)
    self.assertEqual(math_rewards.math_verify(prompts, completions, references), first)

  def test_off_the_main_thread(self):
    """math-verify's own timeouts (signal.alarm) raise here; ours do not."""
    got = {}
    thread = threading.Thread(target=lambda: got.update(rewards=math_rewards.math_verify(
        ["q"] * 2, ["\\boxed{\\frac{1}{2}}", "#### 7"], ["0.5", "8"])))
    thread.start()
    thread.join()
    self.assertEqual(got["rewards"], [1.0, 0.0])

  def test_a_sample_that_runs_too_long_scores_0(self):
    """sympy would spend hours on 9^(9^(9^9)); the child process is killed, then restarts."""
    with mock.patch.object(math_rewards, "TIMEOUT_S", 1.0):
      start = time.monotonic()
      rewards = math_rewards.math_verify(["q"] * 2, ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{5}"],
                                         ["5", "5"])
    self.assertEqual(rewards, [0.0, 1.0])
    self.assertLess(time.monotonic() - start, 60)

  def test_fast(self):
    completions = [f"So {i} + 1 = {i + 1} apples.\n#### {i + 1}" for i in range(200)]
    score("#### 1", "1")  # the child has started
    start = time.monotonic()
    rewards = math_rewards.math_verify([""] * 200, completions,
                                       [f"... #### {i + 1}" for i in range(200)])
    self.assertEqual(rewards, [1.0] * 200)
    self.assertLess(time.monotonic() - start, 20)  # about 0.2 s on an idle CPU

  def test_without_math_verify_the_config_fails_naming_the_package(self):
    code = ("import sys; sys.modules['math_verify'] = None\n"
            "from jaxrl_llm import import_path\n"
            "import_path.load_function('jaxrl_llm.rewards.math:math_verify', "
            "field='config.rewards.functions[0]')")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=False)
    last_line = result.stderr.strip().splitlines()[-1]
    self.assertStartsWith(last_line, "jaxrl_llm.import_path.ImportPathError: "
                          "config.rewards.functions[0]='jaxrl_llm.rewards.math:math_verify': ")
    self.assertIn("jaxrl_llm.rewards.math needs the package math-verify, which is not "
                  "installed: pip install 'math-verify>=0.9'", last_line)


if __name__ == "__main__":
  absltest.main()
