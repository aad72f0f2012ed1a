"""Nothing is lost: determinism, exact resume after SIGKILL, SIGTERM preemption.

Every interrupted run here is the real command line, `python -m launch.train`, in its own
process (forked from tests/cli_runs.py's server, which has imported JAX and the library
once), so a kill is a real kill. One workdir is stopped five ways in a row, each start
resuming what the one before it left: SIGKILLed while committing a checkpoint, SIGTERM
(exit 75), Ctrl-C (exit 75), SIGKILLed between steps, Ctrl-C twice (exit 130); the sixth
start finishes it. What each stop left is checked on the spot, and the finished run must
be the uninterrupted reference run (trained in this process) exactly: every step logged
once with its metrics, the same final parameters. Nothing here is about devices: each
process has as many CPU devices as this one (1 in `make test`).
"""
import dataclasses
import glob
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import weakref

import jax
import numpy as np
import pytest
from absl.testing import absltest
from safetensors.numpy import load_file

from configs import smoke
from jaxrl_llm import training
from jaxrl_llm.training import guards
from tests import cli_runs
from tests import xla_flags
from tests.training.run_logs import comparable

pytestmark = pytest.mark.slow_file(
    "six starts of the real command line (a process each, tracing and compiling every "
    "program of a step) to stop one run five ways and finish it")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Checkpoints every EVERY steps and at the end, the newest KEEP kept; the first start is
# killed while it commits checkpoint PAUSE. STEPS leaves each later start a few steps.
STEPS, EVERY, KEEP, PAUSE = 12, 2, 3, 4
FLAGS = ("--config=configs/smoke.py", f"--config.train.steps={STEPS}",
         f"--config.checkpoint.every={EVERY}", f"--config.checkpoint.keep={KEEP}",
         "--config.optimizer.lr=1e-3",
         "--config.rewards.functions=('tests.training.test_rewards:count_a',)",
         "--config.rewards.weights=(1.0,)")


def flags_config():
  """The config FLAGS give the command line, for the reference run in this process."""
  config = smoke.get_config()
  config.train.steps = STEPS
  config.checkpoint.every = EVERY
  config.checkpoint.keep = KEEP
  config.optimizer.lr = 1e-3
  config.rewards.functions = ("tests.training.test_rewards:count_a",)
  config.rewards.weights = (1.0,)
  return config


def start(workdir, log=None, module="launch.train", flags=(), devices=None):
  """The trainer on `workdir`, as a child process forked from tests/cli_runs.py's server
  (stdout/stderr appended to `log`, by default workdir + '.log')."""
  devices = devices or jax.device_count()
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=xla_flags.for_devices(devices))
  return cli_runs.start(module, [f"--workdir={workdir}", *FLAGS, *flags],
                        stdout=log or workdir + ".log", append=True, env=env, cwd=ROOT)


def finish(proc, log, timeout=600):
  rc = proc.wait(timeout=timeout)
  with open(log, errors="replace") as f:
    return rc, f.read()


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


@dataclasses.dataclass
class Stop:
  """What one start of the run left: its exit status and output, the rows logged and the
  complete checkpoints once it had stopped."""
  rc: int
  log: str
  rows: list
  steps: list


@pytest.mark.slow("its set-up starts the command line six times (five stops, one finish), "
                  "each a process tracing and compiling a step's programs")
class ReliabilityTest(absltest.TestCase):
  """The reference run, then one run started six times (`_stop_five_ways`)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix="reliability_")
    cls.reference = os.path.join(cls.tmp, "reference")
    training.train(flags_config(), cls.reference)
    cls.workdir = os.path.join(cls.tmp, "run")
    cls.stops, cls.failure = {}, None
    try:
      cls._stop_five_ways()
    except Exception as e:  # noqa: BLE001 -- every test below reports it
      cls.failure = e

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  @classmethod
  def _start(cls, name, **kwargs):
    log = os.path.join(cls.tmp, name + ".log")
    return start(cls.workdir, log, **kwargs), log

  @classmethod
  def _stopped(cls, name, proc, log):
    rc, text = finish(proc, log)
    cls.stops[name] = Stop(rc, text, rows(cls.workdir), steps_of(cls.workdir))

  @classmethod
  def _wait_for_a_new_step(cls, proc, at_least=1):
    """Until this start has logged a step >= `at_least` of its own (a resumed run first
    drops the rows of the steps it redoes: their timings tell them from the old ones)."""
    before = rows(cls.workdir)
    wait_for(lambda: any(r["step"] >= at_least and r not in before for r in rows(cls.workdir)),
             proc, f"a step >= {at_least}")

  @classmethod
  def _stop_five_ways(cls):
    w = cls.workdir
    # 1. SIGKILL while checkpoint PAUSE is being committed (a fresh run).
    marker = os.path.join(cls.tmp, "in_write")
    proc, log = cls._start("killed_in_write", module="tests.training.pausing_train",
                           flags=(f"--pause_step={PAUSE}", f"--pause_marker={marker}"))
    wait_for(lambda: os.path.exists(marker), proc, f"the write of checkpoint {PAUSE}")
    proc.send_signal(signal.SIGKILL)
    cls._stopped("killed_in_write", proc, log)
    with open(marker) as f:
      cls.in_write = f.read()
    cls.in_write_was_a_dir = os.path.isdir(cls.in_write)

    # 2. SIGTERM, once the resumed run has redone step PAUSE (and its checkpoint).
    proc, log = cls._start("sigterm")
    cls._wait_for_a_new_step(proc, PAUSE)
    proc.send_signal(signal.SIGTERM)
    cls._stopped("sigterm", proc, log)

    # 3. Ctrl-C, once the resumed run has logged a step.
    proc, log = cls._start("ctrl_c")
    cls._wait_for_a_new_step(proc)
    proc.send_signal(signal.SIGINT)
    cls._stopped("ctrl_c", proc, log)

    # 4. SIGKILL between steps.
    proc, log = cls._start("killed")
    cls._wait_for_a_new_step(proc)
    proc.send_signal(signal.SIGKILL)
    cls._stopped("killed", proc, log)

    # 5. Ctrl-C twice: the second once the first has been taken (its message printed).
    proc, log = cls._start("ctrl_c_twice")
    cls._wait_for_a_new_step(proc)
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "Ctrl-C: finishing this step" in open(log, errors="replace").read(),
             proc, "the first Ctrl-C's message")
    proc.send_signal(signal.SIGINT)
    cls._stopped("ctrl_c_twice", proc, log)

    # 6. To the end.
    cls.steps_before_last = steps_of(w)
    proc, log = cls._start("finished")
    cls._stopped("finished", proc, log)

  def stop(self, name) -> Stop:
    if self.failure is not None:
      raise self.failure
    self.assertIn(name, self.stops)
    return self.stops[name]

  def assert_prefix_of_the_reference(self, stop: Stop):
    """The rows a stopped run left are the reference's first rows, each step once."""
    ref = rows(self.reference)
    self.assertEqual([r["step"] for r in stop.rows], list(range(1, len(stop.rows) + 1)))
    self.assertEqual([comparable(r) for r in stop.rows],
                     [comparable(r) for r in ref[:len(stop.rows)]])

  def assert_checkpointed_and_exited_75(self, stop: Stop, message):
    """Exit 75 with `message`, a checkpoint of the last step logged."""
    self.assertEqual(stop.rc, guards.PREEMPTED_EXIT_CODE, stop.log[-3000:])
    self.assertIn(message, stop.log)
    self.assertNotIn("Traceback", stop.log)
    last = max(r["step"] for r in stop.rows)
    self.assertLess(last, STEPS)
    self.assertIn(last, stop.steps)  # a checkpoint of the step it stopped after
    self.assert_prefix_of_the_reference(stop)

  def test_stopped_and_resumed_five_times_is_the_same_run_as_the_reference(self):
    """Same config and seed give the same run, however often it stops: the last start,
    resuming from what five stops left, ends with every step logged once with the
    reference's metrics and final parameters, exactly."""
    stop = self.stop("finished")
    self.assertEqual(stop.rc, 0, stop.log[-3000:])
    ref, got = rows(self.reference), stop.rows
    self.assertGreater(max(r["reward_mean"] for r in got), 0)  # rewards vary
    self.assertEqual([r["step"] for r in got], list(range(1, STEPS + 1)))
    for a, b in zip(ref, got):
      self.assertEqual(comparable(a), comparable(b), f"step {a['step']}")
    want, have = exported(self.reference), exported(self.workdir)
    self.assertEqual(want.keys(), have.keys())
    for k in want:
      np.testing.assert_array_equal(want[k], have[k], err_msg=k)
    # It wrote the checkpoints due after the one it resumed from, the last at the end,
    # keeping the newest KEEP.
    resumed_from = max(self.steps_before_last)
    due = [s for s in range(resumed_from + 1, STEPS + 1) if s % EVERY == 0 or s == STEPS]
    self.assertEqual(stop.steps, sorted(set(self.steps_before_last + due))[-KEEP:])
    self.assertEqual(stop.steps[-1], STEPS)

  def test_sigkill_while_writing_a_checkpoint_then_resume(self):
    stop = self.stop("killed_in_write")
    self.assertEqual(stop.rc, -signal.SIGKILL)
    # Step PAUSE's files were on disk under a temporary name; the last complete checkpoint
    # is the one before it.
    self.assertTrue(self.in_write_was_a_dir, self.in_write)
    self.assertEqual(stop.steps, [PAUSE - EVERY])
    self.assertLess(max(r["step"] for r in stop.rows), STEPS)
    self.assert_prefix_of_the_reference(stop)
    # The resumed run redid step PAUSE and committed its checkpoint.
    self.assertIn(PAUSE, self.stop("sigterm").steps)

  def test_sigterm_writes_a_checkpoint_and_exits_75_then_resume(self):
    self.assert_checkpointed_and_exited_75(self.stop("sigterm"), "preempted (SIGTERM)")

  def test_ctrl_c_writes_a_checkpoint_and_exits_75_then_resume(self):
    stop = self.stop("ctrl_c")
    self.assert_checkpointed_and_exited_75(stop, "interrupted (Ctrl-C): stopped after step")
    # It resumed from the SIGTERM's checkpoint and went on.
    self.assertGreater(max(r["step"] for r in stop.rows),
                       max(r["step"] for r in self.stop("sigterm").rows))

  def test_sigkill_between_steps_then_resume(self):
    stop = self.stop("killed")
    self.assertEqual(stop.rc, -signal.SIGKILL)
    self.assertLess(max(r["step"] for r in stop.rows), STEPS)
    self.assert_prefix_of_the_reference(stop)

  def test_ctrl_c_twice_stops_at_once(self):
    stop = self.stop("ctrl_c_twice")
    self.assertEqual(stop.rc, 130, stop.log[-3000:])
    # The second Ctrl-C lands mid-step (no checkpoint), or, should it come as the first
    # one's checkpoint is being saved, once that checkpoint is complete, which it says.
    message = re.search(r"aborted \(Ctrl-C\): (no checkpoint written|checkpoint (\d+) written)",
                        stop.log)
    self.assertIsNotNone(message, stop.log[-3000:])
    if message[2] is not None:
      self.assertIn(int(message[2]), stop.steps)
    self.assertNotIn("Traceback", stop.log)


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

  def test_a_second_ctrl_c_swallowed_in_a_weakref_callback_is_not_reported(self):
    # Python hands an exception raised in a weakref callback to sys.unraisablehook (by
    # default: "Exception ignored ... Traceback" on stderr) and goes on; while installed the
    # watch passes on every such exception but the second Ctrl-C's, which requested() raises.
    class Referent:
      pass

    def raise_in_a_weakref_callback(raise_it):
      referent = Referent()
      ref = weakref.ref(referent, lambda _: raise_it())
      del referent, ref

    def not_a_ctrl_c():
      raise ValueError("not a Ctrl-C")

    reported = []
    hook, sys.unraisablehook = sys.unraisablehook, reported.append
    watch = guards.PreemptionWatch()
    try:
      watch.install()
      watch._handle(signal.SIGINT, None)
      raise_in_a_weakref_callback(lambda: watch._handle(signal.SIGINT, None))
      self.assertEqual(reported, [])
      with self.assertRaises(KeyboardInterrupt):
        watch.requested()
      raise_in_a_weakref_callback(not_a_ctrl_c)
      self.assertEqual([r.exc_type for r in reported], [ValueError])
      watch.uninstall()
      self.assertEqual(sys.unraisablehook, reported.append)
    finally:
      watch.uninstall()
      sys.unraisablehook = hook

  def test_a_second_ctrl_c_during_a_save_raises_once_it_is_done(self):
    # orbax's writes, once begun, must finish: the save is not interrupted, and the
    # KeyboardInterrupt that follows names the checkpoint that completes.
    watch = guards.PreemptionWatch()
    watch._handle(signal.SIGINT, None)
    saved = []
    with self.assertRaisesRegex(KeyboardInterrupt, "checkpoint 6 written"):
      with watch.saving(6):
        watch._handle(signal.SIGINT, None)  # returns: no raise inside the save
        saved.append(6)
    self.assertEqual(saved, [6])
    with self.assertRaises(KeyboardInterrupt):
      watch._handle(signal.SIGINT, None)  # outside a save: at once
    once = guards.PreemptionWatch()
    once._handle(signal.SIGINT, None)
    with once.saving(7):  # one Ctrl-C: the stopping checkpoint, nothing raised
      pass

  def test_sigterm_then_ctrl_c_is_still_one_graceful_stop(self):
    watch = guards.PreemptionWatch()
    watch._handle(signal.SIGTERM, None)
    self.assertEqual(watch.signal_name, "SIGTERM")
    self.assertTrue(watch.requested())


if __name__ == "__main__":
  absltest.main()
