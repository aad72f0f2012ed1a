"""Built-in tasks: deterministic disjoint splits, valid problems, demonstrations."""
import random
import re

from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm import rewards
from jaxrl_llm import tasks
from jaxrl_llm.rewards import expression
from jaxrl_llm.tasks import arithmetic
from jaxrl_llm.tasks import base
from jaxrl_llm.tasks import countdown

SMALL = dict(num_train=2000, num_eval=100)


def prompts(records, n=None):
  return [records[i]["prompt"] for i in range(len(records) if n is None else n)]


class SplitsTest(parameterized.TestCase):

  @parameterized.parameters("arithmetic", "countdown")
  def test_deterministic_and_seeded(self, name):
    a = tasks.load_split(name, "train", seed=3, **SMALL)
    b = tasks.load_split(name, "train", seed=3, **SMALL)
    c = tasks.load_split(name, "train", seed=4, **SMALL)
    self.assertEqual(len(a), 2000)
    self.assertEqual([a[i] for i in range(50)], [b[i] for i in range(50)])
    self.assertNotEqual(prompts(a, 50), prompts(c, 50))
    # Random access: record 1234 does not depend on what was read before.
    fresh = tasks.load_split(name, "train", seed=3, **SMALL)
    self.assertEqual(fresh[1234], a[1234])
    self.assertEqual(a[-1], a[1999])
    with self.assertRaises(IndexError):
      a[2000]  # pylint: disable=pointless-statement

  @parameterized.parameters("arithmetic", "countdown")
  def test_eval_distinct_and_disjoint_from_train(self, name):
    # A small problem space, so train draws do hit eval prompts and get redrawn.
    options = (dict(max_value=3, min_operands=2, max_operands=2) if name == "arithmetic"
               else dict(num_numbers=2, max_number=4, max_target=10))
    ev = tasks.load_split(name, "eval", num_eval=10, **options)
    train = tasks.load_split(name, "train", num_train=3000, num_eval=10, **options)
    eval_prompts = prompts(ev)
    self.assertLen(set(eval_prompts), 10)
    train_prompts = set(prompts(train))
    self.assertEmpty(train_prompts & set(eval_prompts))
    # Train covers the whole small space except eval: disjoint by redrawing, not by luck.
    make = {"arithmetic": arithmetic.make_problem, "countdown": countdown.make_problem}[name]
    space = {make(random.Random(i), **options)["prompt"] for i in range(5000)}
    self.assertEqual(train_prompts, space - set(eval_prompts))

  def test_split_aliases_and_unknowns(self):
    self.assertEqual(prompts(tasks.load_split("arithmetic", "test", num_eval=5)),
                     prompts(tasks.load_split("arithmetic", "eval", num_eval=5)))
    with self.assertRaisesRegex(ValueError, "splits 'train' and 'eval', not 'dev'"):
      tasks.load_split("arithmetic", "dev")
    with self.assertRaisesRegex(ValueError, "Unknown task 'sudoku'.*arithmetic"):
      tasks.load_split("sudoku", "train")

  def test_space_too_small_for_eval(self):
    with self.assertRaisesRegex(ValueError, "distinct problems"):
      tasks.load_split("arithmetic", "eval", num_eval=50, max_value=1, min_operands=1,
                       max_operands=1)

  @parameterized.parameters(
      dict(min_operands=3, max_operands=2), dict(max_value=0), dict(operators="+/"),
      dict(operators=""))
  def test_bad_arithmetic_options(self, **options):
    with self.assertRaisesRegex(ValueError, "arithmetic"):
      tasks.load_split("arithmetic", "train", **options)


class ArithmeticTest(absltest.TestCase):

  def test_problems_follow_the_options(self):
    records = tasks.load_split("arithmetic", "train", num_train=500, num_eval=10,
                               min_operands=3, max_operands=4, max_value=9,
                               operators="-*")
    for i in range(len(records)):
      record = records[i]
      prompt = record["prompt"]
      self.assertTrue(prompt.endswith("="))
      self.assertTrue(set(prompt) <= set("0123456789-*="), prompt)
      self.assertIn(prompt.count("-") + prompt.count("*"), (2, 3))
      self.assertEqual(expression.evaluate(prompt[:-1]).value, record["answer"])
      self.assertIsInstance(record["answer"], int)

  def test_short_printable_prompts(self):
    records = tasks.load_split("arithmetic", "train", **SMALL)
    for p in prompts(records):
      self.assertLessEqual(len(p), 9)
      self.assertTrue(p.isascii() and p.isprintable())


class DemonstrationsTest(parameterized.TestCase):

  @parameterized.parameters("arithmetic", "countdown")
  def test_demonstrations_earn_full_reward(self, name):
    task = tasks.TASKS[name]
    demos = tasks.demonstrations(name, "train", **SMALL)
    n = 300
    records = [demos[i] for i in range(n)]
    reward_set = rewards.RewardSet(task.reward_functions, task.reward_weights)
    fields = {k: [r[k] for r in records] for k in records[0] if k not in ("prompt", "completion")}
    out = reward_set([r["prompt"] for r in records], [r["completion"] for r in records],
                     **fields)
    for values in out.per_function.values():
      self.assertEqual(values.tolist(), [1.0] * n)
    # And a wrong completion earns no exact-match reward (the check can fail).
    wrong = reward_set([r["prompt"] for r in records], ["1" + r["completion"] for r in records],
                       **fields)
    exact_name = reward_set.names[0]
    self.assertLess(wrong.per_function[exact_name].mean(), 0.2)

  def test_arithmetic_demonstration_is_the_answer(self):
    demo = tasks.demonstrations("arithmetic", "eval", num_eval=5)[0]
    self.assertEqual(demo["completion"], str(demo["answer"]))
    self.assertEqual(len(tasks.demonstrations("arithmetic", "eval", num_eval=5)), 5)

  def test_countdown_records(self):
    records = tasks.load_split("countdown", "eval", num_eval=200)
    for i in range(len(records)):
      record = records[i]
      self.assertLen(record["numbers"], 4)
      self.assertTrue(1 <= record["target"] <= 100)
      self.assertTrue(all(1 <= n <= 20 for n in record["numbers"]))
      self.assertLessEqual(len(record["prompt"]), 28)
      self.assertEqual(record["prompt"],
                       f"Use {' '.join(map(str, record['numbers']))} to make "
                       f"{record['target']}:")


def needs_carry(prompt: str) -> bool:
  """Whether `a+b=` / `a-b=` needs a carry or a borrow: some column overflows on its own."""
  a, op, b = re.fullmatch(r"(\d+)([+-])(\d+)=", prompt).groups()
  x, y = sorted((int(a), int(b)), reverse=True)
  while x or y:
    if x % 10 + y % 10 >= 10 if op == "+" else x % 10 < y % 10:
      return True
    x, y = x // 10, y // 10
  return False


class SloppyTeacherTest(parameterized.TestCase):
  OPTIONS = dict(min_operands=2, max_operands=2, max_value=30, operators="+-",
                 num_train=4000, num_eval=50)

  @parameterized.parameters(
      ("25+17=", 42, "32"), ("23-7=", 16, "26"), ("7-23=", -16, "-26"), ("19+1=", 20, "10"),
      ("30-9=", 21, "31"), ("100-1=", 99, "109"), ("95+7=", 102, "92"))
  def test_forgets_the_carry(self, prompt, answer, sloppy):
    always = arithmetic.demonstration({"prompt": prompt, "answer": answer}, random.Random(0),
                                      teacher_carry_error=1.0)
    self.assertEqual(always, sloppy)

  @parameterized.parameters("12+7=", "29-13=", "3-14=", "30+0=", "0-0=", "12*3=", "1+2+8=")
  def test_exact_without_a_carry_or_two_operands_of_plus_minus(self, prompt):
    answer = expression.evaluate(prompt[:-1]).value
    demo = arithmetic.demonstration({"prompt": prompt, "answer": answer}, random.Random(0),
                                    teacher_carry_error=1.0)
    self.assertEqual(demo, str(answer))

  def test_error_rate_and_exact_answers(self):
    demos = tasks.demonstrations("arithmetic", "train", teacher_carry_error=0.6,
                                 **self.OPTIONS)
    exact = tasks.load_split("arithmetic", "train", **self.OPTIONS)
    carry = wrong = 0
    for i in range(len(demos)):
      demo = demos[i]
      self.assertEqual({k: v for k, v in demo.items() if k != "completion"}, exact[i])
      self.assertEqual(demo["answer"], expression.evaluate(demo["prompt"][:-1]).value)
      if needs_carry(demo["prompt"]):
        carry += 1
        wrong += demo["completion"] != str(demo["answer"])
        self.assertIn(abs(int(demo["completion"]) - demo["answer"]), (0, 10))
      else:
        self.assertEqual(demo["completion"], str(demo["answer"]))
    self.assertGreater(carry, 1000)  # about 40% of these problems need a carry
    self.assertAlmostEqual(wrong / carry, 0.6, delta=0.04)
    # Deterministic, and independent from record to record: the same problem drawn at
    # two indices can be demonstrated differently.
    again = tasks.demonstrations("arithmetic", "train", teacher_carry_error=0.6,
                                 **self.OPTIONS)
    self.assertEqual([demos[i] for i in range(200)], [again[i] for i in range(200)])
    by_prompt = {}
    for i in range(len(demos)):
      by_prompt.setdefault(demos[i]["prompt"], set()).add(demos[i]["completion"])
    self.assertTrue(any(len(c) == 2 for c in by_prompt.values()))

  def test_default_is_an_exact_teacher(self):
    plain = tasks.demonstrations("arithmetic", "train", **self.OPTIONS)
    zero = tasks.demonstrations("arithmetic", "train", teacher_carry_error=0.0,
                                **self.OPTIONS)
    for i in range(500):
      self.assertEqual(plain[i]["completion"], str(plain[i]["answer"]))
      self.assertEqual(plain[i], zero[i])

  def test_records_unchanged(self):
    for split in ("train", "eval"):
      plain = tasks.load_split("arithmetic", split, **self.OPTIONS)
      sloppy = tasks.load_split("arithmetic", split, teacher_carry_error=0.6, **self.OPTIONS)
      self.assertEqual([plain[i] for i in range(50)], [sloppy[i] for i in range(50)])

  @parameterized.parameters(-0.1, 1.5, float("nan"))
  def test_bad_rate(self, rate):
    with self.assertRaisesRegex(ValueError, "teacher_carry_error is a probability in"):
      tasks.demonstrations("arithmetic", "train", teacher_carry_error=rate)
    with self.assertRaisesRegex(ValueError, "teacher_carry_error"):
      tasks.load_split("arithmetic", "eval", teacher_carry_error=rate)

  def test_countdown_has_no_sloppy_teacher(self):
    with self.assertRaises(TypeError):
      tasks.demonstrations("countdown", "train", teacher_carry_error=0.5)


class GeneratedSplitTest(absltest.TestCase):

  def test_too_small_a_space_for_train(self):
    split = base.GeneratedSplit(lambda rng: {"prompt": "same"}, key="k", size=3,
                                exclude=frozenset({"same"}))
    with self.assertRaisesRegex(RuntimeError, "collided with the eval split"):
      split[0]  # pylint: disable=pointless-statement

  def test_empty_split(self):
    with self.assertRaisesRegex(ValueError, "at least 1 record"):
      base.GeneratedSplit(lambda rng: {"prompt": ""}, key="k", size=0)


if __name__ == "__main__":
  absltest.main()
