"""Asynchronous rollouts with bounded staleness: sample step s + 1.. while step s trains.

With `config.algo.max_async_level = k >= 1`, a background thread samples and scores the
rollouts of the coming steps while the trainer updates. The rollout of step s is
sampled by the policy version `max(s - k, start)`, where version v is the policy after
v updates (the trainer's state at the start of step v) and `start` is the step the run
started or resumed at. So the staleness `s - version` never exceeds k, and the version
schedule, hence every number of a run, is fixed by (k, start), not by timing.

The trainer publishes each new version (`publish`): one copy of the policy parameters, in
the compute dtype, onto the sampler's placement (the rollout mesh of
`config.mesh.rollout_devices`, or a copy on the shared mesh, since the trainer donates its
state; `setup.Models.sampler_copy`). The thread waits for the version
it needs, keeps only the versions still to be used, and queues each rollout with the
version that sampled it (`Rollout.policy_version`). Reward scoring is host code in the same
thread, so it overlaps with the update too.

Several processes (`jax.distributed`): a program that spans processes must be issued in the
same order on every process, or their collectives wait on each other for ever. The two
threads therefore take turns (`ProgramOrder`) in one order fixed by (k, start): the
trainer's step s after the rollout thread has issued the sampling of steps <= s + k, and the
sampling of step s after the trainer's step s - k - 1. A turn of the rollout thread covers
only what every process does together (the sampling programs, agreeing on the prompt
bucket: `RolloutSource.start`); reading its rows, decoding and scoring happen outside its
turn, with no collective, while the trainer's programs run. One process takes the same
turns, so one code path serves both.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable

import jax

from jaxrl_llm import models

_POLL_S = 0.1  # how often a waiting thread checks for `close`


class Closed(Exception):
  """The pipeline closed while a thread waited for its turn."""


class ProgramOrder:
  """The one order in which the trainer and the rollout thread issue their programs.

  The trainer's turn v is step v (v = start - 1: before the first step, the first publish
  and the evaluation at the start); the rollout thread's turn s issues step s's sampling.
  Order: T(start - 1), R(start) .. R(start + k), T(start), R(start + k + 1), T(start + 1), ...
  i.e. R(s) after T(max(s - k - 1, start - 1)), and T(v) after R(min(v + k, steps - 1)).
  """

  def __init__(self, start: int, steps: int, max_async_level: int, closed: threading.Event):
    self.start, self.steps, self.k, self._closed = start, steps, max_async_level, closed
    self._trained, self._sampled = start - 2, start - 1  # the last turns taken
    self._cond = threading.Condition()

  def trainer(self, v: int):
    """The trainer's turn for step v (a context manager)."""
    need = self.start - 1 if v < self.start else min(v + self.k, self.steps - 1)
    return self._turn(lambda: self._trained == v - 1 and self._sampled >= need, "_trained", v)

  def rollout(self, s: int):
    """The rollout thread's turn for step s's sampling (a context manager)."""
    need = max(s - self.k - 1, self.start - 1)
    return self._turn(lambda: self._sampled == s - 1 and self._trained >= need, "_sampled", s)

  def abandon(self) -> None:
    """The rollout thread stopped: the trainer no longer waits for its turns."""
    with self._cond:
      self._sampled = self.steps
      self._cond.notify_all()

  @contextlib.contextmanager
  def _turn(self, ready: Callable[[], bool], counter: str, value: int):
    with self._cond:
      while not ready():
        if self._closed.is_set():
          raise Closed()
        self._cond.wait(_POLL_S)
    try:
      yield
    finally:
      with self._cond:
        setattr(self, counter, max(getattr(self, counter), value))
        self._cond.notify_all()


class RolloutPipeline:
  """The rollouts of steps `start, start + 1, ...`, each from version `max(s - k, start)`.

  Args:
    rollouts: the `rollouts.RolloutSource`: `rollouts.finish(rollouts.start(policy, key))`.
    copy: trained parameters -> a copy where the sampler keeps them (`Models.sampler_copy`).
    as_policy: such a copy -> the `Model` it samples (`Models.on_sampler`).
    start, steps: the first step to sample and the end of the run.
    max_async_level: k >= 0 (0: each step's rollout from the version trained just before it,
      still sampled in the thread; partial rollouts use k - 1, `rollouts.partial`).
    step_key: `step -> PRNG key` (the same keys the synchronous loop uses).
  """

  def __init__(self, rollouts, copy: Callable, as_policy: Callable[[Any], models.Model], *,
               start: int, steps: int, max_async_level: int,
               step_key: Callable[[int], jax.Array]):
    self.rollouts, self.as_policy = rollouts, as_policy
    self.start, self.steps, self.k = start, steps, max_async_level
    self.step_key = step_key
    self.copy = copy
    self._versions: dict[int, Any] = {}
    self._ready = threading.Condition()
    self._out: queue.Queue = queue.Queue()
    self._closed = threading.Event()
    self.order = ProgramOrder(start, steps, max_async_level, self._closed)
    self._thread = threading.Thread(target=self._run, name="rollouts", daemon=True)
    self._started = False

  def version_for(self, step: int) -> int:
    """The policy version that samples step `step`'s rollout."""
    return max(step - self.k, self.start)

  def publish(self, version: int, params) -> None:
    """Hands the sampler the policy after `version` updates (copied; `params` may be donated
    afterwards). Versions no step will sample from are skipped."""
    if not any(self.version_for(s) == version for s in range(version, self.steps)):
      return
    copy = self.copy(params)
    with self._ready:
      self._versions[version] = copy
      self._ready.notify_all()
    if not self._started:
      self._started = True
      self._thread.start()

  def get(self, step: int):
    """Step `step`'s rollout (blocks until sampled); re-raises the thread's error."""
    item = self._out.get()
    if isinstance(item, BaseException):
      raise RuntimeError("the rollout thread failed") from item
    if item.step != step:
      raise RuntimeError(f"rollout of step {item.step} arrived for step {step}")
    return item

  def close(self) -> None:
    """Stops the thread after the rollout it is sampling (if any)."""
    self._closed.set()
    with self._ready:
      self._ready.notify_all()
    if self._started:
      self._thread.join()

  def _wait_for(self, version: int):
    with self._ready:
      while version not in self._versions:
        if self._closed.is_set():
          return None
        self._ready.wait(_POLL_S)
      for old in [v for v in self._versions if v < version]:  # no later step needs them
        del self._versions[old]
      return self._versions[version]

  def _run(self) -> None:
    try:
      for step in range(self.start, self.steps):
        version = self.version_for(step)
        with self.order.rollout(step):  # the version is published: its trainer turn is done
          params = self._wait_for(version)
          if params is None:
            return
          policy, key = self.as_policy(params), self.step_key(step)
          pending = (self.rollouts.start(policy, key, step=step, version=version)
                     if getattr(self.rollouts, "spans_versions", False)
                     else self.rollouts.start(policy, key))
        rollout = self.rollouts.finish(pending)
        rollout.step = step
        if rollout.policy_version is None:  # else the source's own (its oldest token's)
          rollout.policy_version = version
        self._out.put(rollout)
    except Closed:
      return
    except BaseException as e:  # noqa: BLE001 -- handed to the trainer, which re-raises it
      self.order.abandon()
      self._out.put(e)
