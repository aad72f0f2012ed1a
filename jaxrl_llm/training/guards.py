"""What keeps a long run safe: preemption (SIGTERM) and the non-finite update guard.

Preemption: a SIGTERM (what Cloud TPU, Kubernetes and SLURM send before they take a
machine away) or a first Ctrl-C (SIGINT) only raises a flag. The loop finishes the step
it is in, agrees with the other processes that someone was told to stop, writes a
checkpoint of that step, waits for it to be complete and raises `Preempted`; the command
line then exits with status `PREEMPTED_EXIT_CODE` (75, EX_TEMPFAIL: "try again").
Starting the same command again resumes from that checkpoint. A second Ctrl-C raises
`KeyboardInterrupt` at once (the steps since the last checkpoint are lost); should that
exception land where Python swallows it (a weakref or `__del__` callback prints "Exception
ignored" and goes on), the next `requested()` raises it again, so the run never writes
the checkpoint the user refused. One that comes while a checkpoint is being saved
(`saving`: the start of its writes, and for the stopping checkpoint their end) takes
effect once that is done, and that checkpoint completes before the process exits:
orbax's writes, once begun, cannot be abandoned (interrupted, its threads wait minutes
for one another, then fail).

Non-finite updates: `steps.policy_step`/`value_step` skip an update whose loss or
gradient norm is not finite and flag which part was. `NonFiniteGuard` turns the flags
into the `skipped_steps` metric and a warning per skipped step, and stops the run with
`NonFiniteError` after more than `config.train.max_consecutive_skips` skipped steps in
a row. Its counters travel in the checkpoint, so a resumed run counts on.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import jax
from absl import logging

from jaxrl_llm import distributed

PREEMPTED_EXIT_CODE = os.EX_TEMPFAIL  # 75
# Flags from the update steps and the part of the model each one names.
NONFINITE_FLAGS = {"nonfinite_loss": "policy loss", "nonfinite_grad": "policy gradient",
                   "value_nonfinite_loss": "value loss", "value_nonfinite_grad": "value gradient"}


class Preempted(Exception):
  """The run stopped on SIGTERM or Ctrl-C after writing a checkpoint of `step`."""

  def __init__(self, step: int, signal_name: str = "SIGTERM"):
    why = "preempted (SIGTERM)" if signal_name == "SIGTERM" else "interrupted (Ctrl-C)"
    super().__init__(f"{why}: stopped after step {step} and wrote its checkpoint; run the same "
                     "command again to resume")
    self.step = step


class NonFiniteError(RuntimeError):
  """Too many consecutive steps had a non-finite loss or gradient."""


class PreemptionWatch:
  """Between `install()` and `uninstall()`, SIGTERM and a first Ctrl-C set a flag instead
  of killing; a second Ctrl-C raises `KeyboardInterrupt`.

  Signal handlers can only be installed from the main thread; elsewhere (a trainer run
  from a worker thread) the watch is inert and the signals keep their default actions.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self._flag = threading.Event()
    self._hard_stop = False  # set by a second Ctrl-C
    self._deferring = False  # inside `saving`
    self._previous: dict = {}
    self._previous_unraisable = None
    self.signal_name = "SIGTERM"  # the first one this process received

  def install(self) -> None:
    if threading.current_thread() is threading.main_thread():
      self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
      self._previous_unraisable, sys.unraisablehook = sys.unraisablehook, self._unraisable

  def _unraisable(self, unraisable) -> None:
    """The second Ctrl-C's KeyboardInterrupt can land in a weakref callback or `__del__`,
    where Python would print "Exception ignored ... Traceback" and go on: `requested()`
    raises it again at the step's end, so it is not reported. Anything else is."""
    if self._hard_stop and issubclass(unraisable.exc_type, KeyboardInterrupt):
      return
    self._previous_unraisable(unraisable)

  def _handle(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT and self._flag.is_set():
      self._hard_stop = True
      if not self._deferring:
        raise KeyboardInterrupt  # Ctrl-C twice: stop now
      return
    if not self._flag.is_set():
      self.signal_name = signal.Signals(signum).name
    self._flag.set()
    if signum == signal.SIGINT:
      print("\nCtrl-C: finishing this step, then writing a checkpoint (Ctrl-C again to stop "
            "at once, losing the steps since the last checkpoint)", file=sys.stderr, flush=True)

  @contextlib.contextmanager
  def saving(self, step: int):
    """Around checkpoint `step`'s save: a second Ctrl-C raises only after it.

    Raises:
      KeyboardInterrupt: Ctrl-C twice, the second during the save (its text says the
        checkpoint of `step` completes).
    """
    self._deferring = True
    try:
      yield
    finally:
      self._deferring = False
    if self._hard_stop:
      raise KeyboardInterrupt(f"checkpoint {step} written (the second Ctrl-C came as it was "
                              "being saved)")

  def uninstall(self) -> None:
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)
    self._previous = {}
    if self._previous_unraisable is not None:
      sys.unraisablehook, self._previous_unraisable = self._previous_unraisable, None

  def requested(self) -> bool:
    """Whether any process got SIGTERM (a collective: call it on every process).

    Raises:
      KeyboardInterrupt: this process got Ctrl-C twice (in case the handler's own raise
        was swallowed).
    """
    if self._hard_stop:
      raise KeyboardInterrupt
    return distributed.any_true(self._flag.is_set())


class NonFiniteGuard:
  """Counts steps with skipped updates; stops after too many in a row."""

  def __init__(self, max_consecutive: int, skipped_steps: int = 0, consecutive: int = 0):
    self.max_consecutive = int(max_consecutive)
    self.skipped_steps = int(skipped_steps)
    self.consecutive = int(consecutive)
    self._last_parts: list[str] = []

  def update(self, step: int, update_metrics: list[dict]) -> dict[str, float]:
    """Reads one step's non-finite flags; returns the metrics to log.

    Args:
      step: the step just done (1-based, as logged).
      update_metrics: the metrics of each optimizer update of the step (device values:
        only the flags, a few scalars, are fetched).
    """
    update_metrics = jax.device_get([{k: m[k] for k in NONFINITE_FLAGS if k in m}
                                     for m in update_metrics])
    parts = [name for flag, name in NONFINITE_FLAGS.items()
             if any(float(m.get(flag, 0.0)) > 0 for m in update_metrics)]
    skipped = sum(any(float(m.get(flag, 0.0)) > 0 for flag in NONFINITE_FLAGS)
                  for m in update_metrics)
    if skipped:
      self.skipped_steps += 1
      self.consecutive += 1
      logging.warning("step %d: skipped %d of %d updates: non-finite %s (%d in a row)", step,
                      skipped, len(update_metrics), ", ".join(parts), self.consecutive)
    else:
      self.consecutive = 0
    self._last_parts = parts
    return {"skipped_steps": float(self.skipped_steps),
            "skipped_updates": float(skipped)}

  def check(self, step: int) -> None:
    """Raises `NonFiniteError` once more than `max_consecutive` steps in a row skipped."""
    if self.consecutive > self.max_consecutive:
      first = step - self.consecutive + 1
      raise NonFiniteError(
          f"steps {first}-{step}: {self.consecutive} steps in a row had a non-finite "
          f"{' and '.join(self._last_parts)} and skipped their updates; "
          f"config.train.max_consecutive_skips={self.max_consecutive} allows at most "
          f"{self.max_consecutive}. The parameters have not changed since step {first - 1}; "
          "lower the learning rate, or check the rewards and data of these steps")

  def state(self) -> dict[str, int]:
    """What a checkpoint keeps, to count on after a resume."""
    return {"skipped_steps": self.skipped_steps, "consecutive_skips": self.consecutive}

