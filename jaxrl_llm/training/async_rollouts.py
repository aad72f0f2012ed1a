"""Asynchronous rollouts with bounded staleness: sample step s + 1.. while step s trains.

With `config.algo.max_async_level = k >= 1`, a background thread samples and scores the
rollouts of the coming steps while the trainer updates. The rollout of step s is
sampled by the policy version `max(s - k, start)`, where version v is the policy after
v updates (the trainer's state at the start of step v) and `start` is the step the run
started or resumed at. So the staleness `s - version` never exceeds k, and the version
schedule, hence every number of a run, is fixed by (k, start), not by timing.

The trainer publishes each new version (`publish`): one `device_put` of the policy
parameters onto the sampler's placement (the rollout mesh of `config.mesh.rollout_devices`,
or a copy on the shared mesh, since the trainer donates its state). The thread waits for
the version it needs, keeps only the versions still to be used, and queues each rollout
with the version that sampled it (`Rollout.policy_version`). Reward scoring is host code
in the same thread, so it overlaps with the update too.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import jax

from jaxrl_llm import models

_POLL_S = 0.1  # how often a waiting thread checks for `close`


class RolloutPipeline:
  """The rollouts of steps `start, start + 1, ...`, each from version `max(s - k, start)`.

  Args:
    rollouts: `rollout.SampledRollouts`: `rollouts(policy, key) -> Rollout`.
    policy: a `Model` placed where the sampler runs (its parameters are ignored).
    start, steps: the first step to sample and the end of the run.
    max_async_level: k >= 1.
    step_key: `step -> PRNG key` (the same keys the synchronous loop uses).
  """

  def __init__(self, rollouts: Callable, policy: models.Model, *, start: int, steps: int,
               max_async_level: int, step_key: Callable[[int], jax.Array]):
    self.rollouts, self.policy = rollouts, policy
    self.start, self.steps, self.k = start, steps, max_async_level
    self.step_key = step_key
    self.shardings = jax.tree.map(lambda x: x.sharding, policy.params)
    self._versions: dict[int, Any] = {}
    self._ready = threading.Condition()
    self._out: queue.Queue = queue.Queue()
    self._closed = threading.Event()
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
    copy = jax.device_put(params, self.shardings, may_alias=False)
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
        params = self._wait_for(version)
        if params is None:
          return
        rollout = self.rollouts(self.policy.replace(params=params), self.step_key(step))
        rollout.step, rollout.policy_version = step, version
        self._out.put(rollout)
    except BaseException as e:  # noqa: BLE001 -- handed to the trainer, which re-raises it
      self._out.put(e)
