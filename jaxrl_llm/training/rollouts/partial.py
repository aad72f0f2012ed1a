"""Partial rollouts (`config.rollouts.partial`): generations that span weight publishes, and
each step's batch the first `prompts_per_step` groups to finish.

Without them, a step's rollout waits for its longest completion, while most of the engine's
slots sit empty. Here every process keeps one engine (`serving.PartialEngine`, on its first
device) full across steps: prompts are queued a batch ahead, a freed slot takes the next
request at once, and step s's batch is the first P groups (all G samples ended) to finish.
Requests still decoding carry on into the next step under the weights published for it.

Versions. Step s's collection runs under policy version w(s) = max(s - k + 1, start), one
update fresher than without partial rollouts (k = `algo.max_async_level`), so that a sample
begun in one step and finished in the next still has every token within the staleness
bound: at step s a sample's oldest token is at least s - k. When the collection for step s
starts, a sample whose first token is older than s - k (it would exceed the bound) starts
again from its prompt (`partial/restarted`). With k = 1 the collection and the update
therefore take turns, and the gain is the long tail that no longer holds up a step; with
k >= 2 they also overlap.

What a token records. Every token keeps the version that sampled it and its behaviour
log-prob under that version: at a publish a request's keys and values are recomputed under
the new weights (`serving.partial`), so the log-prob of each token is one forward of its own
version; the trainer's off-policy corrections (TIS, IcePop) read them token by token. A
rollout's `policy_version` is its oldest token's; `partial/tokens_lag_J` is the share of
its tokens sampled by version s - J.

Keys and order. A request of the prompt batch at data position q draws from
fold_in(fold_in(the key of the step that queued it, q), row), row its place in the global
batch; which requests end first is fixed by the engine's decode steps, not by time, so a
run is reproducible. Checkpoints keep the samples in flight (`Rollout.in_flight`: every
process's, as JSON in the checkpoint's metadata) and the data position after the last
prompts queued; a resumed run takes them up (`restore`), and with k = 1 goes on exactly as
the uninterrupted run. Resumed on another number of processes, they start afresh.
"""
from __future__ import annotations

import collections
import dataclasses
import json
from typing import Iterator

import jax
import numpy as np

from jaxrl_llm import data, sampling, serving
from jaxrl_llm.training.plan import Plan
from jaxrl_llm.training.rollouts.episodes import local_model
from jaxrl_llm.training.rollouts.contract import Rollout
from jaxrl_llm.training.rollouts.sampled import Block, Pending, SampledRollouts

CHUNK_STEPS = 8  # decode steps per engine call: a freed slot is refilled within this many


@dataclasses.dataclass
class Group:
  """A prompt's G samples: its batch, its row `p` there, its prompt ids, its G keys, the
  ended samples."""
  batch: data.RecordBatch
  p: int
  prompt: list[int]
  keys: np.ndarray
  truncated: int  # prompts cut to max_prompt_len (counted on a batch's first group)
  done: dict = dataclasses.field(default_factory=dict)  # sample g -> serving.Finished


class PartialRollouts(SampledRollouts):
  """Single-turn rollouts whose generations span publishes (module docstring); the
  interface of `SampledRollouts`, with `start` told the step and the version."""

  spans_versions = True

  def __init__(self, plan: Plan, settings: sampling.SamplingSettings,
               prompt_format: data.PromptFormat, tokenizer,
               batches: Iterator[data.RecordBatch], judge=None):
    super().__init__(plan, settings, prompt_format, tokenizer, batches, sampler=None,
                     judge=judge)
    self.settings, self.k = settings, plan.max_async_level
    self.engine: serving.PartialEngine | None = None
    self.P = 0  # this process's prompts per step
    self.groups: dict[int, Group] = {}
    self.complete: collections.deque[int] = collections.deque()  # ended groups, in order
    self.next_group, self.position, self.restarted = 0, 0, 0
    self._key = None  # the current step's, for the requests queued during it
    self._restored: dict | None = None  # a checkpoint's samples in flight (`restore`)

  def start(self, policy, key: jax.Array, *, step: int, version: int):
    """This process's copy of the policy (a program every process issues together)."""
    return step, version, key, local_model(policy)

  def finish(self, pending) -> Rollout:
    """Publishes the version, decodes until P groups have ended, scores the first P."""
    step, version, self._key, model = pending
    if self.engine is None and self._restored is not None:
      self._resume(model, version, step)
    elif self.engine is None:
      batch = next(self.batches)
      self.engine = self._make_engine(model, version, len(batch.records))
      self._queue(batch)
    else:
      self._publish(model, version, oldest=step - self.k)
    restarted, self.restarted = self.restarted, 0
    self._top_up()
    while len(self.complete) < self.P:
      self.engine.run(self._ended)
    chosen = [self.groups.pop(self.complete.popleft()) for _ in range(self.P)]
    rollout = super().finish(Pending([self._block(chosen)]))
    rollout.position = self.position
    versions = np.stack([_padded(f.versions, self.settings.max_new_tokens, -1)
                         for group in chosen for f in _samples(group)])
    rollout.policy_version = int(versions[versions >= 0].min())
    rollout.metrics.update(version_metrics(step, versions, restarted, self.k,
                                           len(self.engine.running) + len(self.engine.waiting)))
    snapshot = self._snapshot()  # now: the next step's publish changes the engine
    rollout.in_flight = lambda: json.dumps(snapshot, default=plain)  # if a checkpoint asks
    return rollout

  def restore(self, in_flight: list[str]) -> None:
    """Takes up the samples a checkpoint kept in flight (`Rollout.in_flight` of every
    process), resumed at the first `finish`; a checkpoint of another process count has
    none that fit, and they start afresh."""
    self._restored = this_process_in_flight(in_flight, "samples")

  def close(self) -> None:
    self.engine = None

  def _snapshot(self) -> dict:
    """The samples in flight: each group's record and ended samples, the engine's requests."""
    groups = {gid: {"position": g.batch.position, "index": g.batch.indices[g.p],
                    "record": g.batch.records[g.p],
                    "source": None if g.batch.sources is None else g.batch.sources[g.p],
                    "source_positions": g.batch.source_positions, "prompt": g.prompt,
                    "keys": g.keys, "truncated": g.truncated,
                    "done": {g_: dataclasses.asdict(f) for g_, f in g.done.items()}}
              for gid, g in self.groups.items()}
    return {"P": self.P, "next_group": self.next_group, "position": self.position,
            "complete": list(self.complete), "groups": groups,
            "engine": self.engine.snapshot()}

  def _resume(self, model, version: int, step: int) -> None:
    """The engine and groups of a checkpoint's snapshot, then the step's publish."""
    snap, self._restored = self._restored, None
    self.next_group, self.position = snap["next_group"], snap["position"]
    self.complete = collections.deque(snap["complete"])
    for gid, g in snap["groups"].items():
      batch = data.RecordBatch(
          g["position"], np.asarray([g["index"]]), [g["record"]], np.ones(1, bool),
          None if g["source"] is None else np.asarray([g["source"]], np.int32),
          g["source_positions"])
      self.groups[int(gid)] = Group(batch, 0, g["prompt"], np.asarray(g["keys"], np.uint32),
                                    g["truncated"], {int(k): serving.Finished(**f)
                                                     for k, f in g["done"].items()})
    self.engine = self._make_engine(model, version, snap["P"])
    self.engine.restore(snap["engine"])
    self._publish(model, version, oldest=step - self.k)

  def _make_engine(self, model, version: int, prompts: int) -> serving.PartialEngine:
    """An engine with a slot for each of a step's P * G requests, context for the longest
    prompt and `max_new_tokens`."""
    self.P = prompts
    Q, N = self.settings.page_size, self.settings.max_new_tokens
    layout = serving.Layout(slots=prompts * self.G,
                            context=(-(-self.format.max_prompt_len // Q) + -(-N // Q)) * Q,
                            page_size=Q, chunk_steps=CHUNK_STEPS, top_logprobs=0)
    return serving.PartialEngine(model, self.settings, layout, version)

  def _publish(self, model, version: int, oldest: int) -> None:
    """The new version for every request still decoding; samples whose first token is older
    than `oldest` start again, ended ones included."""
    before = self.engine.restarted
    self.engine.publish(model, version, oldest)
    self.restarted += self.engine.restarted - before
    for gid, group in self.groups.items():
      for g in [g for g, f in group.done.items() if min(f.versions) < oldest]:
        del group.done[g]
        self.engine.submit(gid * self.G + g, group.prompt, self.settings.max_new_tokens,
                           group.keys[g], first=True)
        self.restarted += 1
    self.complete = collections.deque(g for g in self.complete
                                      if len(self.groups[g].done) == self.G)

  def _top_up(self) -> None:
    """Queues prompt batches until a step's worth of requests waits for a slot."""
    while len(self.engine.waiting) < self.engine.layout.slots:
      self._queue(next(self.batches))

  def _queue(self, batch: data.RecordBatch) -> None:
    """Queues a prompt batch's P * G requests."""
    prompts = self.format.tokenize(self.tokenizer, batch.prompts, indices=batch.indices)
    G, P, key = self.G, len(batch.records), self._key
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
    first = jax.process_index() * P * G  # this process's first row of the global batch
    keys = np.asarray(sampling.numbered_keys(jax.random.fold_in(key, batch.position),
                                             range(first, first + P * G)))
    for p, ids in enumerate(prompts.token_lists):
      gid, self.next_group = self.next_group, self.next_group + 1
      self.groups[gid] = Group(batch, p, list(ids), keys[p * G:(p + 1) * G],
                               prompts.num_truncated if p == 0 else 0)
      for g in range(G):
        self.engine.submit(gid * G + g, ids, self.settings.max_new_tokens, keys[p * G + g])
    self.position = batch.position + 1

  def _ended(self, ended: list[serving.Finished]) -> bool:
    """Files the requests that just ended; True once P groups are complete."""
    for f in ended:
      gid, g = divmod(f.id, self.G)
      self.groups[gid].done[g] = f
      if len(self.groups[gid].done) == self.G:
        self.complete.append(gid)
    self._top_up()  # freed slots take waiting requests at once
    return len(self.complete) >= self.P

  def _block(self, chosen: list[Group]) -> Block:
    """The chosen groups as one block of sampling (their records, prompts and samples)."""
    batch = data.RecordBatch(
        position=self.position - 1,
        indices=np.asarray([g.batch.indices[g.p] for g in chosen]),
        records=[g.batch.records[g.p] for g in chosen], valid=np.ones(len(chosen), bool),
        sources=(None if chosen[0].batch.sources is None else
                 np.asarray([g.batch.sources[g.p] for g in chosen], np.int32)),
        source_positions=chosen[-1].batch.source_positions)
    prompts = dataclasses.replace(
        self.format.tokenize(self.tokenizer, batch.prompts, indices=batch.indices),
        num_truncated=sum(g.truncated for g in chosen))
    N, pad = self.settings.max_new_tokens, self.settings.pad_id
    samples = [f for group in chosen for f in _samples(group)]
    tokens = np.stack([_padded(f.tokens, N, pad) for f in samples]).astype(np.int32)
    logprobs = np.stack([_padded(f.logprobs, N, 0.0) for f in samples]).astype(np.float32)
    lengths = np.asarray([len(f.tokens) for f in samples], np.int32)
    mask = (np.arange(N)[None] < lengths[:, None]).astype(np.int32)
    out = sampling.SampleOutput(tokens=tokens, mask=mask, logprobs=logprobs, lengths=lengths,
                                truncated=np.asarray([not f.eos for f in samples]))
    return Block(batch, prompts, out)


def this_process_in_flight(in_flight: list[str], what: str) -> dict | None:
  """This process's part of what a checkpoint kept in flight (`Rollout.in_flight` of every
  process), or None if it was written by another number of processes (they start afresh)."""
  if len(in_flight) != jax.process_count():
    print(f"partial rollouts: the checkpoint kept the {what} in flight of {len(in_flight)} "
          f"processes, this run has {jax.process_count()}: they start afresh")
    return None
  return json.loads(in_flight[jax.process_index()])


def version_metrics(step: int, versions: np.ndarray, restarted: int, k: int,
                    in_flight: int) -> dict:
  """The mix of versions in a batch (`versions`: each sample's tokens', -1 past its end):
  the share of tokens sampled J updates before the step (J = 0..k), of samples spanning a
  publish, the samples restarted and those still in flight."""
  sampled = versions >= 0
  lag = step - versions[sampled]
  spans = [len(set(row[row >= 0].tolist())) > 1 for row in versions]
  row = {f"partial/tokens_lag_{j}": float(np.mean(lag == j)) for j in range(k + 1)}
  row.update({"partial/spanning_frac": float(np.mean(spans)),
              "partial/restarted": float(restarted), "partial/in_flight": float(in_flight)})
  return row


def plain(x):
  """JSON for numpy values."""
  if isinstance(x, np.ndarray):
    return x.tolist()
  if isinstance(x, np.generic):
    return x.item()
  raise TypeError(f"{type(x).__name__} is not JSON serializable")


def _samples(group: Group) -> list:
  return [group.done[g] for g in sorted(group.done)]


def _padded(values, length: int, fill) -> np.ndarray:
  out = np.full(length, fill, np.asarray(values).dtype if len(values) else np.float32)
  out[:len(values)] = values
  return out
