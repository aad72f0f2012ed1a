"""Nothing is lost: determinism, exact resume after SIGKILL, SIGTERM preemption.

Every run here is the real command line, `python -m launch.train`, in its own process
(8 CPU devices, as in the rest of the suite), so a kill is a real kill.
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl.testing import absltest
from safetensors.numpy import load_file

from jaxrl_llm.training import guards
from tests.training.run_logs import comparable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, EVERY = 10, 3  # checkpoints at steps 3, 6, 9 and 10
FLAGS = ("--config=configs/smoke.py", f"--config.train.steps={STEPS}",
         f"--config.checkpoint.every={EVERY}", "--config.checkpoint.keep=3",
         "--config.optimizer.lr=1e-3",
         "--config.rewards.functions=('tests.training.test_rewards:count_a',)",
         "--config.rewards.weights=(1.0,)")


def start(workdir, module="launch.train", env=None):
  """The trainer on `workdir`, as a child process (stdout/stderr to workdir/../NAME.log)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS="--xla_force_host_platform_device_count=8", **(env or {}))
  log = open(workdir + ".log", "ab")
  return subprocess.Popen([sys.executable, "-m", module, f"--workdir={workdir}", *FLAGS],
                          cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def finish(proc, workdir, timeout=600):
  rc = proc.wait(timeout=timeout)
  return rc, open(workdir + ".log", errors="replace").read()


def rows(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.endswith("\n")]


def wait_for(predicate, proc, what, timeout=600):
  deadline = time.time() + timeout
  while not predicate():
    if proc.poll() is not None:
      raise AssertionError(f"the run exited ({proc.returncode}) before {what}")
    if time.time() > deadline:
      proc.kill()
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.005)


def exported(workdir):
  (path,) = glob.glob(os.path.join(workdir, "export", "*.safetensors"))
  return load_file(path)


def steps_of(workdir):
  return sorted(int(os.path.basename(p)) for p in glob.glob(os.path.join(workdir, "checkpoints", "*"))
                if os.path.basename(p).isdigit())


class ReliabilityTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix="reliability_")
    cls.reference = os.path.join(cls.tmp, "reference")
    rc, log = finish(start(cls.reference), cls.reference)
    assert rc == 0, log[-3000:]

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def assert_same_run(self, workdir):
    """The run in `workdir` logged every step once, with the reference's metrics and
    final parameters, exactly."""
    ref, got = rows(self.reference), rows(workdir)
    self.assertEqual([r["step"] for r in got], list(range(1, STEPS + 1)))
    for a, b in zip(ref, got):
      self.assertEqual(comparable(a), comparable(b), f"step {a['step']}")
    want, have = exported(self.reference), exported(workdir)
    self.assertEqual(want.keys(), have.keys())
    for k in want:
      np.testing.assert_array_equal(want[k], have[k], err_msg=k)

  def kill(self, proc):
    proc.send_signal(signal.SIGKILL)
    self.assertEqual(proc.wait(), -signal.SIGKILL)

  def assert_resume_completes_the_same_run(self, workdir):
    rc, log = finish(start(workdir), workdir)
    self.assertEqual(rc, 0, log[-3000:])
    self.assert_same_run(workdir)

  def test_same_config_and_seed_give_the_same_run(self):
    again = os.path.join(self.tmp, "again")
    rc, log = finish(start(again), again)
    self.assertEqual(rc, 0, log[-3000:])
    self.assertGreater(max(r["reward_mean"] for r in rows(again)), 0)  # rewards vary
    self.assert_same_run(again)

  def test_sigkill_between_steps_then_resume(self):
    workdir = os.path.join(self.tmp, "killed")
    proc = start(workdir)
    wait_for(lambda: any(r["step"] >= 4 for r in rows(workdir)), proc, "step 4")
    self.kill(proc)
    self.assertLess(max(r["step"] for r in rows(workdir)), STEPS)
    self.assert_resume_completes_the_same_run(workdir)

  def test_sigkill_while_writing_a_checkpoint_then_resume(self):
    workdir = os.path.join(self.tmp, "killed_in_write")
    marker = os.path.join(self.tmp, "in_write")
    proc = start(workdir, module="tests.training.pausing_train",
                 env={"PAUSE_STEP": "6", "PAUSE_MARKER": marker})
    wait_for(lambda: os.path.exists(marker), proc, "the write of checkpoint 6")
    self.kill(proc)
    # Step 6's files are on disk under a temporary name; the last complete checkpoint is 3.
    with open(marker) as f:
      self.assertTrue(os.path.isdir(f.read()))
    self.assertEqual(steps_of(workdir), [3])
    self.assert_resume_completes_the_same_run(workdir)
    self.assertEqual(steps_of(workdir), [6, 9, 10])

  def stop_after_a_step(self, workdir, signum):
    """Starts a run, sends `signum` once it has logged a step; its exit status and log."""
    proc = start(workdir)
    wait_for(lambda: any(r["step"] >= 1 for r in rows(workdir)), proc, "step 1")
    proc.send_signal(signum)
    return finish(proc, workdir)

  def assert_checkpointed_then_resumed(self, workdir, rc, log, message):
    """Exit 75 with `message`, a checkpoint of the last step logged, then an exact resume."""
    self.assertEqual(rc, guards.PREEMPTED_EXIT_CODE, log[-3000:])
    self.assertIn(message, log)
    self.assertNotIn("Traceback", log)
    last = max(r["step"] for r in rows(workdir))
    self.assertLess(last, STEPS)
    self.assertIn(last, steps_of(workdir))  # a checkpoint of the step it stopped after
    self.assert_resume_completes_the_same_run(workdir)

  def test_sigterm_writes_a_checkpoint_and_exits_75_then_resume(self):
    workdir = os.path.join(self.tmp, "preempted")
    rc, log = self.stop_after_a_step(workdir, signal.SIGTERM)
    self.assert_checkpointed_then_resumed(workdir, rc, log, "preempted (SIGTERM)")

  def test_ctrl_c_writes_a_checkpoint_and_exits_75_then_resume(self):
    workdir = os.path.join(self.tmp, "interrupted")
    rc, log = self.stop_after_a_step(workdir, signal.SIGINT)
    self.assert_checkpointed_then_resumed(workdir, rc, log,
                                          "interrupted (Ctrl-C): stopped after step")

  def test_ctrl_c_twice_stops_at_once(self):
    workdir = os.path.join(self.tmp, "aborted")
    proc = start(workdir)
    wait_for(lambda: any(r["step"] >= 1 for r in rows(workdir)), proc, "step 1")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    rc, log = finish(proc, workdir)
    self.assertEqual(rc, 130, log[-3000:])
    self.assertIn("aborted (Ctrl-C): no checkpoint written", log)
    self.assertNotIn("Traceback", log)


class PreemptionWatchTest(absltest.TestCase):

  def test_a_swallowed_second_ctrl_c_still_stops_before_the_checkpoint(self):
    # The second Ctrl-C's KeyboardInterrupt can land in a weakref callback, where Python
    # prints "Exception ignored" and goes on; the step-end check must raise it again.
    watch = guards.PreemptionWatch()
    watch._handle(signal.SIGINT, None)
    self.assertTrue(watch.requested())
    with self.assertRaises(KeyboardInterrupt):
      watch._handle(signal.SIGINT, None)  # raised, and (in the flake) swallowed
    with self.assertRaises(KeyboardInterrupt):
      watch.requested()

  def test_sigterm_then_ctrl_c_is_still_one_graceful_stop(self):
    watch = guards.PreemptionWatch()
    watch._handle(signal.SIGTERM, None)
    self.assertEqual(watch.signal_name, "SIGTERM")
    self.assertTrue(watch.requested())


if __name__ == "__main__":
  absltest.main()
