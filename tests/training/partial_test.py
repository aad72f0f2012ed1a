"""Partial rollouts through the trainer: the staleness bound on each sample's oldest token,
the mix of versions in the metrics, and an exact resume from a checkpoint taken while
samples were in flight."""
import numpy as np
import pytest
from absl.testing import absltest

from jaxrl_llm import training
from jaxrl_llm.config import presets
from tests.training.run_logs import comparable, read_jsonl, resume_from_step_two


def partial_config(steps: int = 4, max_async_level: int = 1):
  """The demo's warm start on 4 prompts x 8 samples of up to 16 tokens at temperature 1.5:
  most answers end in a few tokens, some run on (a long tail), so groups end at different
  decode steps and later ones span a publish."""
  config = presets.load_module("grpo_arithmetic").get_config(f"steps={steps}")
  config.algo.max_async_level = max_async_level
  config.rollouts.partial = True
  config.train.prompts_per_step = 4
  config.train.micro_batch_size = 32
  config.sampling.max_new_tokens = 16
  config.sampling.temperature = 1.5
  config.algo.behaviour_mask.level = "token"  # IcePop, on each token's own behaviour log-prob
  config.train.eval_every = 0
  config.checkpoint.every = 2
  return config


class PartialRolloutsTest(absltest.TestCase):

  @pytest.mark.slow("the demo's warm start (not a tiny model) sampling 4 x 8 samples "
                    "partially over four steps, then resumed from step 2: the resume needs "
                    "samples in flight in its checkpoint and steps after it to compare")
  def test_bound_versions_and_an_exact_resume_with_samples_in_flight(self):
    config = partial_config()
    first = self.create_tempdir().full_path
    training.train(config, first)
    rows = read_jsonl(first)
    self.assertEqual([r["step"] for r in rows], [1, 2, 3, 4])
    for r in rows:
      self.assertLessEqual(r["async/staleness_max"], 1)  # the oldest token of every sample
      self.assertAlmostEqual(r["partial/tokens_lag_0"] + r["partial/tokens_lag_1"], 1.0, 6)
      self.assertTrue(0.0 <= r["behaviour_mask_frac"] <= 1.0 and np.isfinite(r["loss"]), r)
    self.assertGreater(max(r["partial/spanning_frac"] for r in rows), 0.0)
    self.assertGreater(max(r["partial/tokens_lag_1"] for r in rows), 0.0)
    self.assertGreater(rows[1]["partial/in_flight"], 0)  # the step-2 checkpoint kept some
    # With max_async_level 1 a step samples with the version trained just before it, so a
    # resumed run takes the same versions; with the samples in flight restored it is exact.
    resumed = resume_from_step_two(config, first, self.create_tempdir().full_path)
    self.assertEqual([r["step"] for r in resumed], [1, 2, 3, 4])
    self.assertEqual([comparable(r) for r in resumed], [comparable(r) for r in rows])


if __name__ == "__main__":
  absltest.main()
