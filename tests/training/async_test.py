"""Asynchronous rollouts: the synchronous loop unchanged, the staleness bound, resume."""
import functools
import json
import os
import signal
import tempfile

import jax
import numpy as np
import pytest
from absl.testing import absltest

from jaxrl_llm import training
from tests import cli_runs
from tests import xla_flags
from tests.training import async_configs
from jaxrl_llm.training import guards
from tests.training.run_logs import comparable, read_jsonl, resume_from_step_two
from tests.training.reliability_test import ROOT, finish, rows, steps_of, wait_for

# Metrics of `async_configs.golden_config()` on 2 CPU devices, first written by the trainer at
# commit ff34889 (before asynchronous rollouts existed), re-recorded when each completion began
# to draw from its own keys (`python -m tests.training.record_metrics`).
RECORDED = os.path.join(os.path.dirname(__file__), "sync_metrics_recorded.json")


def run_golden(workdir: str) -> list[dict]:
  """The comparable metrics of the synchronous golden run, trained in `workdir`."""
  config = async_configs.golden_config()
  assert config.algo.max_async_level == 0
  training.train(config, workdir, devices=jax.devices()[:2])
  return [comparable(r) for r in read_jsonl(workdir)]


def _split_config(max_async_level, steps):
  """Rollouts on 2 of the 8 devices (tensor-parallel), the trainer on the other 6."""
  config = async_configs.golden_config(steps)
  config.train.prompts_per_step = 3  # 24 rows: 4 per trainer device
  config.train.micro_batch_size = 24
  config.mesh.rollout_devices = 2
  config.algo.max_async_level = max_async_level
  return config


@functools.cache
def split_run(max_async_level: int) -> tuple[str, list[dict]]:
  """(workdir, rows) of `_split_config(max_async_level, steps=4)`, run once per module: at
  level 1 with a checkpoint every 2 steps (for `ResumeTest`), at level 2 with the IcePop
  mask against the recorded behaviour log-probs."""
  config = _split_config(max_async_level, steps=4)
  if max_async_level == 1:
    config.checkpoint.every = 2
  if max_async_level == 2:
    config.algo.behaviour_mask.level = "token"
  workdir = tempfile.mkdtemp(prefix=f"async_split_{max_async_level}_")
  training.train(config, workdir)
  return workdir, read_jsonl(workdir)


class SynchronousTest(absltest.TestCase):

  def test_level_zero_reproduces_the_recorded_metrics(self):
    rows = run_golden(self.create_tempdir().full_path)
    with open(RECORDED) as f:
      recorded = json.load(f)
    self.assertLen(rows, len(recorded))
    for got, want in zip(rows, recorded):
      self.assertEqual(got.keys(), want.keys())  # no new metrics
      # Bit for bit on the machine that recorded them (2026-11-30); another CPU's XLA may
      # round differently.
      for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)

  @pytest.mark.mesh
  def test_split_placement_without_staleness(self):
    # On-policy in float32 the behaviour weights are 1 up to rounding: the mask is a no-op.
    config = _split_config(0, steps=2)
    config.algo.behaviour_mask.level = "token"
    workdir = self.create_tempdir().full_path
    training.train(config, workdir)
    rows = read_jsonl(workdir)
    self.assertEqual([r["step"] for r in rows], [1, 2])
    self.assertTrue(all(np.isfinite(r["loss"]) and r["reward_mean"] > 0 for r in rows), rows)
    self.assertNotIn("async/staleness_max", rows[0])
    self.assertEqual([r["behaviour_mask_frac"] for r in rows], [0.0, 0.0])


@pytest.mark.mesh
class StalenessTest(absltest.TestCase):

  def test_versions_within_the_bound(self):
    # Version v = the policy after v updates; step s (0-based) samples with max(s - k, 0).
    for k, versions in ((1, [0, 0, 1, 2]), (2, [0, 0, 0, 1])):
      # k == 2: the IcePop mask against the recorded behaviour log-probs, logged
      _, rows = split_run(k)
      self.assertEqual([r["step"] for r in rows], [1, 2, 3, 4])
      self.assertEqual([r["async/policy_version"] for r in rows], versions, f"k={k}")
      for r in rows:
        stale = r["step"] - 1 - r["async/policy_version"]
        self.assertEqual(r["async/staleness_max"], stale)
        self.assertLessEqual(r["async/staleness_max"], k)
        self.assertTrue(np.isfinite(r["loss"]), r)
      if k == 2:
        fracs = [r["behaviour_mask_frac"] for r in rows]
        self.assertTrue(all(0.0 <= f <= 1.0 for f in fracs), fracs)
      else:
        self.assertNotIn("behaviour_mask_frac", rows[0])


class FailureTest(absltest.TestCase):

  def test_an_error_in_the_rollout_thread_stops_the_run(self):
    config = async_configs.golden_config(steps=4)
    config.algo.max_async_level = 1
    config.rewards.functions = ("tests.training.test_rewards:fail_on_third_call",)
    workdir = self.create_tempdir().full_path
    with self.assertRaisesRegex(RuntimeError, "the rollout thread failed") as caught:
      training.train(config, workdir, devices=jax.devices()[:2])
    self.assertIn("reward service down", str(caught.exception.__cause__))
    self.assertLen(read_jsonl(workdir), 2)  # the steps before it trained and logged


@pytest.mark.mesh
class ResumeTest(absltest.TestCase):

  def test_resume_restarts_the_pipeline_from_the_checkpoint(self):
    config = _split_config(1, steps=4)
    config.checkpoint.every = 2
    first, rows = split_run(1)  # the run StalenessTest checks at k=1
    self.assertEqual([r["async/policy_version"] for r in rows], [0, 0, 1, 2])
    resumed = resume_from_step_two(config, first, self.create_tempdir().full_path)
    self.assertEqual([r["step"] for r in resumed], [1, 2, 3, 4])  # each step logged once
    # Steps 3 and 4 sample with the checkpoint's policy (version 2), from its data position.
    self.assertEqual([r["async/policy_version"] for r in resumed[2:]], [2, 2])
    self.assertEqual([r["data_position"] for r in resumed], [1, 2, 3, 4])
    # Step 3's batch is the same prompts, sampled by a newer policy: the same step-3 key,
    # so with version 2 instead of 1 its numbers differ from the uninterrupted run's.
    self.assertNotEqual(resumed[2]["entropy"], rows[2]["entropy"])


class PreemptionTest(absltest.TestCase):

  @pytest.mark.slow("two starts of the real command line (the process's SIGTERM handling and exit "
                    "status are what is checked), each tracing and compiling the asynchronous "
                    "trainer's programs")
  def test_sigterm_checkpoints_and_the_resumed_run_logs_each_step_once(self):
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    flags = ("--config=configs/smoke.py", "--config.train.steps=8", "--config.checkpoint.every=0",
             "--config.algo.max_async_level=1", "--config.mesh.rollout_devices=1")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               XLA_FLAGS=xla_flags.for_devices(2))

    def start(log):  # forked from tests/cli_runs.py's server
      return cli_runs.start("launch.train", [f"--workdir={workdir}", *flags], stdout=log,
                            env=env, cwd=ROOT)

    first, second = workdir + ".1.log", workdir + ".2.log"
    proc = start(first)
    wait_for(lambda: any(r["step"] >= 1 for r in rows(workdir)), proc, "step 1")
    proc.send_signal(signal.SIGTERM)
    _, log = finish(proc, first)
    self.assertEqual(proc.returncode, guards.PREEMPTED_EXIT_CODE, log[-3000:])
    last = max(r["step"] for r in rows(workdir))
    self.assertLess(last, 8)
    self.assertEqual(steps_of(workdir), [last])  # a checkpoint of the step it stopped after
    proc = start(second)
    _, log = finish(proc, second)
    self.assertEqual(proc.returncode, 0, log[-3000:])
    got = rows(workdir)
    self.assertEqual([r["step"] for r in got], list(range(1, 9)))
    # The resumed pipeline starts from the checkpoint's policy: version `last` samples the
    # steps after it, one update stale at most as before.
    self.assertEqual(got[last]["async/policy_version"], last)
    self.assertTrue(all(r["async/staleness_max"] <= 1 for r in got))


if __name__ == "__main__":
  absltest.main()
