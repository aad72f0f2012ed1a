"""pass@k and maj@K (`training.pass_at_k`), the answers they vote on (`training.answers`),
`config.eval`'s checks, the trainer's `eval/pass@k/k` metrics, and K episodes per record
(`training.sampled_eval`)."""
import json
import math
import os

import numpy as np
from absl.testing import absltest, parameterized

from configs import arithmetic, grpo_arithmetic, grpo_calculator
from jaxrl_llm import config as config_lib
from jaxrl_llm import data, training
from jaxrl_llm import sharding as sh
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.rewards import calculator
from jaxrl_llm.training import answers, evaluation, pass_at_k, sampled_eval
from jaxrl_llm.training import setup as setup_lib


def exact_pass_at_k(n, c, k):
  """The estimator in binomials, as Chen et al. write it: 1 - C(n - c, k) / C(n, k)."""
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def shout(completion):  # an extractor named by import path below
  return completion.upper() or None


def not_a_string(completion):
  return 7


class EstimatorTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("one_of_five_two_right", 5, 2, 1, 0.4),  # c / n
      ("two_of_five_two_right", 5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
      ("none_right", 5, 0, 3, 0.0),
      ("fewer_wrong_than_k", 5, 4, 2, 1.0),  # n - c = 1 < k: every pair holds a right one
      ("all_right", 4, 4, 1, 1.0),
      ("k_is_n", 4, 1, 4, 1.0),
  )
  def test_hand_worked(self, n, c, k, expected):
    self.assertAlmostEqual(pass_at_k.pass_at_k(n, c, k), expected, places=12)

  def test_product_form_is_the_binomial_form(self):
    for n in range(1, 13):
      for c in range(n + 1):
        for k in range(1, n + 1):
          self.assertAlmostEqual(pass_at_k.pass_at_k(n, c, k), exact_pass_at_k(n, c, k),
                                 places=12, msg=(n, c, k))

  def test_large_n_stays_finite(self):  # C(1000, 500) would overflow a float
    value = pass_at_k.pass_at_k(1000, 3, 500)
    self.assertAlmostEqual(value, 1 - (500 * 499 * 498) / (1000 * 999 * 998), places=12)

  @parameterized.parameters((5, 2, 0), (5, 2, 6), (5, 6, 1))
  def test_out_of_range(self, n, c, k):
    with self.assertRaisesRegex(ValueError, f"n={n}, c={c}, k={k}"):
      pass_at_k.pass_at_k(n, c, k)

  def test_per_record_and_mean(self):
    correct = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_allclose(pass_at_k.pass_at_k_per_record(correct, 2), [0.7, 0.0, 1.0])
    # pass@1 is the mean correctness of the samples, exactly.
    self.assertAlmostEqual(pass_at_k.pass_at_k_per_record(correct, 1).mean(), correct.mean())

  @parameterized.parameters((1, (1,)), (2, (1, 2)), (4, (1, 2, 4)), (6, (1, 2, 4, 6)),
                            (8, (1, 2, 4, 8)), (9, (1, 2, 4, 8, 9)))
  def test_default_ks(self, n, ks):
    self.assertEqual(pass_at_k.default_ks(n), ks)

  def test_resolve_ks(self):
    self.assertEqual(pass_at_k.resolve_ks((), 4), (1, 2, 4))
    self.assertEqual(pass_at_k.resolve_ks((4, 1, 4), 4), (1, 4))
    with self.assertRaisesRegex(ValueError, r"config.eval.pass_k=\(1, 8\): expected each k an "
                                r"integer in \[1, 4\] \(the samples per record\); 8 is not"):
      pass_at_k.resolve_ks((1, 8), 4)


class MajorityTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("clear_winner", ["3", "4", "3"], "3"),
      ("tie_goes_to_first_seen", ["4", "3", "3", "4"], "4"),
      ("none_never_wins", [None, None, None, "5"], "5"),
      ("only_none", [None, None], None),
      ("empty", [], None),
  )
  def test_majority(self, votes, winner):
    self.assertEqual(pass_at_k.majority(votes), winner)

  @parameterized.named_parameters(
      ("winner_right", ["37", "27", "37"], [True, False, True], True),
      ("winner_wrong", ["27", "37", "27"], [False, True, False], False),
      ("tie_first_seen_wrong", ["27", "37", "27", "37"], [False, True, False, True], False),
      ("tie_first_seen_right", ["37", "27", "27", "37"], [True, False, False, True], True),
      ("right_sample_has_no_answer", [None, None, "4"], [True, True, False], False),
      ("no_answers", [None, None], [True, True], False),
      # A sample of the winning answer that the reward calls right is enough.
      ("same_answer_scored_differently", ["8", "8", "9"], [False, True, False], True),
  )
  def test_majority_correct(self, votes, correct, expected):
    self.assertEqual(pass_at_k.majority_correct(votes, correct), expected)

  def test_summarize(self):
    correct = np.array([[True, False], [False, False]])
    votes = [["1", "2"], [None, "3"]]
    rewards = np.array([[1.5, 0.5], [0.0, 0.5]])
    self.assertEqual(pass_at_k.summarize(correct, votes, rewards, (1, 2)),
                     {"pass@1": 0.25, "pass@2": 0.5, "maj@2": 0.5, "reward_mean": 0.625})


class AnswersTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("arithmetic", "jaxrl_llm.rewards.arithmetic:arithmetic_exact", " -9\nmore", "-9"),
      ("arithmetic_none", "jaxrl_llm.rewards.arithmetic:arithmetic_exact", "nine", None),
      ("calculator", "jaxrl_llm.rewards.calculator:calculator_exact", "3901", "3901"),
      ("gsm8k", "jaxrl_llm.rewards.gsm8k:gsm8k_exact", "so #### 7.0", "7"),
      ("gsm8k_boxed", "jaxrl_llm.rewards.gsm8k:gsm8k_exact", "\\boxed{7/2}", "7/2"),
      ("gsm8k_none", "jaxrl_llm.rewards.gsm8k:gsm8k_exact", "7", None),
      ("countdown", "jaxrl_llm.rewards.countdown:countdown_exact", "(1+2)*3=9\n", "(1+2)*3"),
      ("any_other_reward", "tests.rewards.fake_rewards:length", "work\n 42 \n\n", "42"),
      ("any_other_reward_empty", "tests.rewards.fake_rewards:length", " \n", None),
  )
  def test_built_in_by_first_reward(self, reward, completion, expected):
    extractor = answers.extractor_for("", (reward, "jaxrl_llm.rewards.gsm8k:gsm8k_format"))
    self.assertEqual(answers.extract(extractor, completion), expected)

  def test_import_path(self):
    extractor = answers.extractor_for(f"{__name__}:shout", ("x:y",))
    self.assertEqual(answers.extract(extractor, "ok"), "OK")
    bad = answers.extractor_for(f"{__name__}:not_a_string", ("x:y",))
    with self.assertRaisesRegex(TypeError, "config.eval.answer_extractor: the extractor "
                                "returned int 7 for 'ok': expected a str or None"):
      answers.extract(bad, "ok")


class EvalConfigTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("negative_samples", dict(num_samples=-1),
       "config.eval.num_samples=-1: expected an integer >= 0 (0 = greedy evaluation only)"),
      ("k_above_samples", dict(num_samples=4, pass_k=(1, 8)),
       "config.eval.pass_k=(1, 8): expected each k an integer in [1, 4] (eval.num_samples); "
       "8 is not"),
      ("k_zero", dict(num_samples=4, pass_k=(0, 2)),
       "config.eval.pass_k=(0, 2): expected each k an integer in [1, 4] (eval.num_samples); "
       "0 is not"),
      ("k_without_samples", dict(pass_k=(1,)),
       "config.eval.pass_k=(1,): expected () when eval.num_samples is 0"),
      ("correct_at_nan", dict(correct_at=float("nan")),
       "config.eval.correct_at=nan: expected a finite reward total"),
      ("extractor_missing", dict(answer_extractor="tests.nope:f"),
       "config.eval.answer_extractor='tests.nope:f': Import path names module 'tests.nope'"),
  )
  def test_refused(self, fields, message):
    config = config_lib.preset("grpo:runlocal")
    config.eval.update(fields)
    with self.assertRaises(config_lib.ConfigError) as raised:
      config_lib.validate(config)
    self.assertIn(message, str(raised.exception))

  def test_defaults_and_a_good_setting_pass(self):
    config = config_lib.preset("grpo:runlocal")
    self.assertEqual((config.eval.num_samples, tuple(config.eval.pass_k)), (0, ()))
    config_lib.validate(config)
    config.eval.update(dict(num_samples=4, pass_k=(1, 4), answer_extractor=f"{__name__}:shout"))
    config_lib.validate(config)


class TrainingMetricsTest(absltest.TestCase):

  def test_a_tiny_run_logs_pass_at_k(self):
    config = grpo_arithmetic.get_config("runlocal")
    config.train.steps = 1
    config.train.eval_every = 1
    config.data.task_options.num_eval = 8
    config.eval.num_samples = 4
    config.logging.trackers = ("jsonl",)
    workdir = self.create_tempdir().full_path
    training.train(config, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    self.assertEqual([r["step"] for r in rows], [0, 1])
    for row in rows:
      values = [row[f"eval/pass@k/{k}"] for k in (1, 2, 4)]
      self.assertEqual(sorted(values), values, row)  # non-decreasing in k
      self.assertBetween(values[0], 0.0, 1.0)
      self.assertIn("eval/reward/arithmetic_exact", row)  # the greedy metrics, as before
      self.assertNotIn("eval/pass@k/8", row)

  def test_mixed_sources_log_per_source(self):
    config = arithmetic.get_config("preset=mixed,runlocal")
    for source in config.sources.values():
      source.task_options.num_eval = 4
    config.eval.update(dict(num_samples=2, pass_k=(2,)))
    config_lib.validate(config)
    mesh, rules = sh.split_meshes(config.mesh)[0], sh.freeze_rules(config.mesh.rules)
    tokenizer, policy = setup_lib.load_tokenizer_and_policy(config, mesh, rules)
    metrics = evaluation.Evaluators(config, tokenizer, policy.config)(policy)
    self.assertEqual(sorted(k for k in metrics if "pass@k" in k),
                     ["eval/distill/pass@k/2", "eval/rl/pass@k/2"])
    # Both sources evaluate the same data with the same rewards: the same numbers.
    self.assertEqual(metrics["eval/distill/pass@k/2"], metrics["eval/rl/pass@k/2"])


class SampledEpisodesTest(absltest.TestCase):

  def test_k_episodes_per_record(self):
    config = grpo_calculator.get_config("runlocal")
    config.data.task_options.num_eval = 2
    config_lib.validate(config)
    mesh, rules = sh.split_meshes(config.mesh)[0], sh.freeze_rules(config.mesh.rules)
    tokenizer, policy = setup_lib.load_tokenizer_and_policy(config, mesh, rules)
    source = sources_lib.run_sources(config)[0]
    sampled = sampled_eval.SampledEval.for_source(config, tokenizer, policy.config, source, 3)
    dataset = data.load_dataset(config.data, "eval", task_options=config.data.task_options)
    batch = next(data.sequential_batches(dataset, 2))
    try:
      drawn = sampled.sample(sampled.model(policy), batch)
    finally:
      sampled.close()
    self.assertEqual([len(c) for c in drawn.completions], [3, 3])  # K episodes per record
    texts = [c for cs in drawn.completions for c in cs]
    answers_K = [r["answer"] for r in batch.records for _ in range(3)]
    np.testing.assert_array_equal(drawn.rewards.per_function["calculator_exact"],
                                  calculator.calculator_exact([], texts, answers_K))
    self.assertIn("env", drawn.rewards.per_function)  # the episodes' step rewards
    np.testing.assert_array_equal(drawn.correct, drawn.totals >= config.eval.correct_at)


if __name__ == "__main__":
  absltest.main()
