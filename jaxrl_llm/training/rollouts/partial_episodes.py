"""Partial rollouts of episodes (`config.rollouts.partial` with multi-turn sources): episodes
that span weight publishes, and each step's batch the first `prompts_per_step` groups whose
G episodes have all ended.

Every process keeps its players' serving engines (`admitted.AdmittedEpisodePlayer`, one per
source, on its first device) busy across steps: the episodes of a step's worth of groups
beyond the current one are in flight at all times, each driven by a thread of its own as
episode-level admission drives them (its next turn is submitted as soon as its environment
has answered). A step takes the first P groups to end; the others carry on into the next
step under the weights published for it. Nothing waits for the slowest episode of a batch,
nor for an environment at a publish.

Versions are per turn. A publish waits for the turns decoding to end, then the engine takes
the new weights (`serving.Engine.publish(after_running=True)`): each model turn is sampled
by one version, and a turn after a publish re-prefills the episode under the new weights
(the engine forgets held sequences at a publish), so every token's behaviour log-prob is
one forward of the version that sampled it over the episode before it. The wait is at most
one turn's decode (`sampling.max_new_tokens` tokens), never an environment's reply: an
episode waiting for its environment holds no slot.

The bound. As for single-turn partial rollouts (`rollouts.partial`, "Versions"), step s's
collection runs under version max(s - k + 1, start), k = `algo.max_async_level`, and a
sample's oldest token must be at least s - k: an episode whose first turn is older restarts
from its environment's `reset` (the same key; `partial/restarted`), checked before each of
its turns, when it ends, and for the ended episodes of unfinished groups at each publish.
A rollout's `policy_version` is its oldest token's; `partial/tokens_lag_J` is the share of
its model tokens sampled by version s - J.

What is not exact. Which version samples which turn depends on when environments answer,
so a run is not reproducible token for token (an episode's keys are: episode r of the
prompt batch at data position q draws from fold_in(fold_in(key, q), r), the key of the
step that queued it). A checkpoint keeps the records of the groups in flight and the data
position after the last batch queued; a resumed run plays those groups again from their
`reset` (an environment's state between turns is not kept), so no record is skipped or
played twice.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import threading

import jax
import numpy as np

from jaxrl_llm import data, sampling
from jaxrl_llm.envs import episode as episode_lib
from jaxrl_llm.training.plan import Plan
from jaxrl_llm.training.rollouts import admitted, partial
from jaxrl_llm.training.rollouts.contract import Rollout
from jaxrl_llm.training.rollouts.episodes import local_model
from jaxrl_llm.training.rollouts.multi_turn import EpisodeRollouts


@dataclasses.dataclass
class Group:
  """A record's G episodes: its batch and row `p` there, its source's index, its G keys,
  the ended episodes."""
  batch: data.RecordBatch
  p: int
  source: int
  keys: np.ndarray
  done: dict = dataclasses.field(default_factory=dict)  # episode g -> Episode


class PartialEpisodeRollouts(EpisodeRollouts):
  """Episodes whose turns span publishes (module docstring); the interface of
  `EpisodeRollouts`, with `start` told the step and the version."""

  spans_versions = True

  def __init__(self, plan: Plan, settings: sampling.SamplingSettings,
               prompt_format: data.PromptFormat, tokenizer, batches, judge=None):
    super().__init__(plan, settings, prompt_format, tokenizer, batches, judge)
    for player in self.players:
      if not isinstance(player, admitted.AdmittedEpisodePlayer):
        raise ValueError(f"rollouts.partial=True: {player.name} is played turn by turn in "
                         "lockstep (sampling.engine='static'): expected the continuous engine")
    self.k = plan.max_async_level
    self.P, self.next_group, self.position, self.restarted = 0, 0, 0, 0
    self.groups: dict[int, Group] = {}
    self.complete: collections.deque[int] = collections.deque()
    self._cond = threading.Condition()
    self._oldest = float("-inf")  # the oldest version a turn may come from now
    self._failure: BaseException | None = None
    self._closing = False
    self._drivers: concurrent.futures.ThreadPoolExecutor | None = None
    self._key = None
    self._restored: dict | None = None

  def start(self, policy, key: jax.Array, *, step: int, version: int):
    """This process's copy of the policy (a program every process issues together)."""
    return step, version, key, local_model(policy)

  def finish(self, pending) -> Rollout:
    """Publishes the version, waits for P groups to end, lays out the first P."""
    step, version, self._key, model = pending
    with self._cond:
      self._oldest = step - self.k
    first = self._drivers is None
    if first:
      restored, self._restored = self._restored, None
      self._begin(model, version, restored)
    else:
      for player in self.players:
        player.serve(model, 0, version, after_running=True)
      self._restart_stale()
    restarted = self._top_up_and_wait()
    with self._cond:
      chosen = [self.groups.pop(self.complete.popleft()) for _ in range(self.P)]
      in_flight = self._snapshot()
    batch = _batch_of(chosen, self.position)
    sources = np.asarray([g.source for g in chosen], np.int32)
    rollout = self.lay_out(batch, sources, [[g.done[i]] for g in chosen for i in range(self.G)])
    rollout.position = self.position
    versions = np.stack([_token_versions(g.done[i], self.width)
                         for g in chosen for i in range(self.G)])
    rollout.policy_version = int(versions[versions >= 0].min()) if (versions >= 0).any() \
        else version
    rollout.metrics.update(partial.version_metrics(step, versions, restarted, self.k,
                                                   self._in_flight()))
    rollout.in_flight = lambda: json.dumps(in_flight, default=partial.plain)
    return rollout

  def restore(self, in_flight: list[str]) -> None:
    """Takes up the groups a checkpoint kept in flight (played again from their reset)."""
    self._restored = partial.this_process_in_flight(in_flight, "episodes")

  def close(self) -> None:
    with self._cond:
      self._closing = True
      self._cond.notify_all()
    if self._drivers is not None:
      self._drivers.shutdown(wait=False, cancel_futures=True)
    super().close()  # closes the engines: a driver waiting for a turn gets an error, and ends

  # -- groups ------------------------------------------------------------------------------

  def _begin(self, model, version: int, restored: dict | None) -> None:
    """The engines and drivers, and the first groups: a checkpoint's, else a batch."""
    batch = None if restored else next(self.batches)
    self.P = restored["P"] if restored else len(batch.records)
    for player in self.players:
      player.serve(model, self.P * self.G, version)
    self._drivers = concurrent.futures.ThreadPoolExecutor(
        4 * self.P * self.G, thread_name_prefix="episode")
    if restored:
      self.next_group, self.position = restored["next_group"], restored["position"]
      for gid, g in sorted(restored["groups"].items(), key=lambda item: int(item[0])):
        one = data.RecordBatch(g["position"], np.asarray([g["index"]]), [g["record"]],
                               np.ones(1, bool),
                               np.asarray([g["source"]], np.int32) if g["mixed"] else None,
                               g["source_positions"])
        self._add(int(gid), Group(one, 0, g["source"], np.asarray(g["keys"], np.uint32)))
    else:
      self._queue(batch)

  def _queue(self, batch: data.RecordBatch) -> None:
    """Starts the G episodes of each of a prompt batch's records."""
    key = self._key
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
    G, P = self.G, len(batch.records)
    first = jax.process_index() * P * G  # this process's first row of the global batch
    keys = np.asarray(sampling.numbered_keys(jax.random.fold_in(key, batch.position),
                                             range(first, first + P * G)))
    sources = batch.sources if batch.sources is not None else np.zeros(P, np.int32)
    for p in range(P):
      gid, self.next_group = self.next_group, self.next_group + 1
      self._add(gid, Group(batch, p, int(sources[p]), keys[p * G:(p + 1) * G]))
    self.position = batch.position + 1

  def _add(self, gid: int, group: Group) -> None:
    with self._cond:
      self.groups[gid] = group
    for g in range(self.G):
      self._drivers.submit(self._drive, gid, g)

  def _top_up_and_wait(self) -> int:
    """Queues batches while fewer than 2P groups are unchosen, then waits until P have
    ended; the episodes restarted since the last call."""
    while True:
      with self._cond:
        short = len(self.groups) < 2 * self.P
      if not short:
        break
      self._queue(next(self.batches))
    with self._cond:
      while len(self.complete) < self.P and self._failure is None:
        self._cond.wait()
      if self._failure is not None:
        raise self._failure
      restarted, self.restarted = self.restarted, 0
    return restarted

  def _restart_stale(self) -> None:
    """At a publish: the ended episodes of unchosen groups older than the bound play again."""
    with self._cond:
      for gid, group in self.groups.items():
        for g in [g for g, ep in group.done.items() if _oldest_version(ep) < self._oldest]:
          del group.done[g]
          self.restarted += 1
          self._drivers.submit(self._drive, gid, g)
      self.complete = collections.deque(g for g in self.complete
                                        if len(self.groups[g].done) == self.G)

  def _drive(self, gid: int, g: int) -> None:
    """Plays episode g of group gid until it ends within the bound, and files it."""
    try:
      with self._cond:
        group = self.groups[gid]
      player = self.players[group.source]
      record = group.batch.records[group.p]
      where = f"{player.name}, record {int(group.batch.indices[group.p])}"
      while not self._closing:
        try:
          ep = player.play_one(player.engine, dict(record), where, group.keys[g],
                               oldest=lambda: self._oldest)
        except admitted.Stale:
          ep = None
        with self._cond:
          if ep is not None and _oldest_version(ep) >= self._oldest:
            group.done[g] = ep
            if len(group.done) == self.G:
              self.complete.append(gid)
              self._cond.notify_all()
            return
          self.restarted += 1
    except BaseException as e:  # pylint: disable=broad-except
      with self._cond:
        if self._failure is None and not self._closing:
          self._failure = e
        self._cond.notify_all()

  def _in_flight(self) -> int:
    with self._cond:
      return sum(self.G - len(group.done) for group in self.groups.values())

  def _snapshot(self) -> dict:
    """The unchosen groups' records (played again from their reset on resume)."""
    groups = {gid: {"position": g.batch.position, "index": g.batch.indices[g.p],
                    "record": g.batch.records[g.p], "source": g.source,
                    "mixed": g.batch.sources is not None,
                    "source_positions": g.batch.source_positions, "keys": g.keys}
              for gid, g in self.groups.items()}
    return {"P": self.P, "next_group": self.next_group, "position": self.position,
            "groups": groups}


def _batch_of(chosen: list[Group], position: int) -> data.RecordBatch:
  return data.RecordBatch(
      position=position - 1, indices=np.asarray([g.batch.indices[g.p] for g in chosen]),
      records=[g.batch.records[g.p] for g in chosen], valid=np.ones(len(chosen), bool),
      sources=(None if chosen[0].batch.sources is None else
               np.asarray([g.source for g in chosen], np.int32)),
      source_positions=chosen[-1].batch.source_positions)


def _oldest_version(ep: episode_lib.Episode) -> float:
  return min(ep.turn_versions, default=float("inf"))


def _token_versions(ep: episode_lib.Episode, width: int) -> np.ndarray:
  """The version of each of the episode's model tokens, in order, padded with -1."""
  out = np.full(width, -1, np.int64)
  versions = [v for n, v in zip(ep.turn_lengths, ep.turn_versions) for _ in range(n)]
  out[:len(versions)] = versions[:width]
  return out
