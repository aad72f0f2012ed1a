"""The rollout contract (`training.rollouts`): every producer is a `RolloutSource`, and a
rollout's stats become the step's metrics by `rollouts.summary`."""
import numpy as np
from absl.testing import absltest

from jaxrl_llm import config as config_lib
from jaxrl_llm.config import reward_checks
from jaxrl_llm.training import rollouts
from jaxrl_llm.training.rollouts import episodes, summary


def _rewards(total, per_function, sources, group_valid, informative):
  return rollouts.RewardStats(
      per_function={k: np.float32(v) for k, v in per_function.items()},
      total=np.float32(total), shaped=np.float32(total) - 0.5,
      group_valid=np.asarray(group_valid), informative=np.asarray(informative),
      sources=np.int32(sources), rounds=np.asarray([2]))


class ContractTest(absltest.TestCase):

  def test_every_producer_is_a_rollout_source(self):
    for producer in (rollouts.SampledRollouts, rollouts.EpisodeRollouts,
                     rollouts.ConversationRollouts, rollouts.DatasetRollouts):
      self.assertTrue(issubclass(producer, rollouts.RolloutSource), producer.__name__)

  def test_the_episode_fields_are_those_the_preflight_counts_as_present(self):
    self.assertEqual(tuple(episodes.episode_fields([])), reward_checks.EPISODE_FIELDS)

  def test_a_rollouts_attention_is_its_mask_unless_episodes_add_their_own(self):
    mask = np.array([[1, 1, 0]], np.int32)
    stats = rollouts.RolloutStats(np.array([2]), np.array([False]), np.array([0]))
    rollout = rollouts.Rollout(
        prompt_tokens=np.ones((1, 2), np.int32), prompt_mask=np.ones((1, 2), np.int32),
        tokens=np.ones((1, 3), np.int32), mask=mask, logprobs=None, lengths=np.array([2]),
        truncated=np.array([False]), rewards=np.zeros(1, np.float32),
        group_valid=np.array([True]), position=1, prompts=["p"], completions=["c"],
        stats=stats)
    self.assertIs(rollout.attention, mask)
    attention = np.ones((1, 3), np.int32)
    rollout.episodes = rollouts.EpisodeParts(attention, [{}])
    self.assertIs(rollout.attention, attention)


class SummaryTest(absltest.TestCase):

  def test_one_source(self):
    algo = config_lib.preset("dapo").algo  # dynamic sampling and overlong shaping on
    stats = rollouts.RolloutStats(
        lengths=np.array([2, 4, 6, 8]), truncated=np.array([False, False, True, True]),
        truncated_prompts=np.array([1]),
        rewards=_rewards([0, 1, 1, 1], {"exact": [0, 1, 1, 1]}, [0] * 4, [True, False],
                         [True, False, False]))
    metrics = summary.summarize(stats, (), algo)
    self.assertEqual(metrics["reward/exact"], 0.75)
    self.assertEqual(metrics["reward_mean"], 0.75)
    self.assertAlmostEqual(metrics["reward_std"], float(np.std([0, 1, 1, 1])), places=6)
    self.assertAlmostEqual(metrics["zero_variance_group_frac"], 2 / 3)
    self.assertEqual(metrics["response_length_mean"], 5.0)
    self.assertEqual(metrics["truncated_frac"], 0.5)
    self.assertEqual(metrics["prompts_truncated"], 1.0)
    self.assertEqual(metrics["dynamic_sampling_rounds"], 2.0)
    self.assertEqual(metrics["dynamic_sampling_filler_frac"], 0.5)
    self.assertEqual(metrics["reward_shaped_mean"], 0.25)

  def test_a_mixed_batch_per_source(self):
    algo = config_lib.preset("grpo").algo
    nan = float("nan")
    stats = rollouts.RolloutStats(
        lengths=np.array([2, 4, 6, 8]), truncated=np.array([False, True, False, False]),
        truncated_prompts=np.array([0]),
        rewards=_rewards([0, 1, 0.5, 0.5], {"a/exact": [0, 1, nan, nan],
                                            "b/len": [nan, nan, 0.5, 0.5]},
                         [0, 0, 1, 1], [True, True], [True, False]))
    metrics = summary.summarize(stats, ("a", "b", "c"), algo)
    self.assertEqual(metrics["rows/a"], 2.0)
    self.assertEqual(metrics["rows/c"], 0.0)
    self.assertNotIn("reward_mean/c", metrics)
    self.assertEqual(metrics["reward_mean/a"], 0.5)
    self.assertEqual(metrics["response_length_mean/b"], 7.0)
    self.assertEqual(metrics["truncated_frac/a"], 0.5)
    self.assertEqual(metrics["reward/a/exact"], 0.5)
    self.assertEqual(metrics["reward/b/len"], 0.5)
    self.assertNotIn("reward/a/exact/b", metrics)

  def test_demonstrations_have_lengths_only(self):
    stats = rollouts.RolloutStats(np.array([3, 5]), np.array([False, True]), np.array([0]))
    self.assertEqual(summary.summarize(stats), dict(
        response_length_mean=4.0, truncated_frac=0.5, prompts_truncated=0.0))

  def test_episodes(self):
    episodes = rollouts.EpisodeStats(
        turns=np.array([1, 3]), model_tokens=np.array([10, 20]), ended=np.array([0, 0]),
        dropped=np.array([False, True]),
        tool_stats={"calls": np.array([4]), "ok": np.array([3]), "unknown_tool": np.array([1])})
    metrics = summary.episode_metrics(episodes)
    self.assertEqual(metrics["env/turns_mean"], 2.0)
    self.assertEqual(metrics["env/model_tokens_mean"], 15.0)
    self.assertEqual(metrics["env/dropped"], 1.0)
    self.assertEqual(metrics["env/tool_calls"], 4.0)
    self.assertEqual(metrics["env/tool_ok_frac"], 0.75)
    self.assertEqual(metrics["env/tool_unknown_tool"], 1.0)
    self.assertEqual(sum(v for k, v in metrics.items() if k.startswith("env/ended/")), 1.0)


if __name__ == "__main__":
  absltest.main()
