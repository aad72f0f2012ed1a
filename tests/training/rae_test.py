"""RAE's baselines are training state: they move with the rewards, are checkpointed, and a
resumed run continues from them exactly."""
from absl.testing import absltest

from configs import arithmetic
from jaxrl_llm import training
from jaxrl_llm.config import ConfigError
from jaxrl_llm import config as config_lib
from tests.training.run_logs import comparable, read_jsonl, resume_from_step_two


def rae_config():
  config = arithmetic.get_config("preset=grpo,runlocal")
  config.algo.advantage.estimator = "rae"
  config.algo.kl.coef, config.algo.kl.placement = 0.0, "none"
  config.train.steps = 4
  config.train.log_every = 1
  config.checkpoint.every = 2
  return config


class RaeRunTest(absltest.TestCase):

  def test_baselines_move_and_resume_exactly(self):
    first, second = self.create_tempdir().full_path, self.create_tempdir().full_path
    training.train(rae_config(), first)
    rows = read_jsonl(first)
    baselines = [r["rae_baseline"] for r in rows]
    # From 0, an EMA (decay 0.95) over 32 rows a step of rewards in [0, 1.1] (exact match
    # plus format; the warm start earns ~0.8): most of the way there after one step.
    self.assertTrue(all(0.5 < b < 1.1 for b in baselines), baselines)
    self.assertLen(set(baselines), 4)  # it follows each step's rewards
    # Resume from the step-2 checkpoint: the rest of the run is the same, baselines included.
    resumed = resume_from_step_two(rae_config(), first, second)
    self.assertEqual([comparable(r) for r in resumed], [comparable(r) for r in rows])

  def test_kl_in_the_reward_is_refused(self):
    config = rae_config()
    config.algo.kl.coef, config.algo.kl.placement = 0.1, "reward"
    with self.assertRaisesRegex(ConfigError, "keeps baselines of the outcome reward"):
      config_lib.validate(config)


if __name__ == "__main__":
  absltest.main()
