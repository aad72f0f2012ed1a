"""Generations that outlive a weight publish (partial rollouts): the serving engine's slot
programs driven from the caller's thread, in an order fixed by the requests alone.

```python
engine = serving.PartialEngine(model, sampling_settings, layout, version=0)
engine.submit(0, prompt_ids, budget=512, key=key_data)
done = engine.run(lambda ended: True)           # decode until a request ends
engine.publish(new_model, version=1, oldest=0)  # the others go on under the new weights
state = engine.snapshot()                        # requests in flight, as plain data
```

Unlike `Engine` (a thread that admits requests whenever they arrive), nothing here depends
on timing: `run` admits waiting requests into free slots in submission order, decodes one
chunk at a time (a chunk stops early when a request ends while others wait) and checks the
caller's condition after each chunk. So which tokens each weight version samples is fixed by
the requests, their keys and the order of `publish` and `run` calls, and a run is
reproducible.

At `publish` every request still decoding goes on under the new weights. Its keys and
values are recomputed (`slots.refill`: one prefill of its prompt and its tokens so far), so
each token's behaviour log-prob is that of one forward of the version that sampled it, over
the whole sequence; keeping the old keys and values would save the prefill but make the
later tokens' log-probs those of no single policy. A request whose first token is older
than `oldest` is restarted from its prompt instead (same key; counted in `restarted`).
Every token records the version that sampled it (`Finished.versions`). `snapshot` and
`restore` carry the requests in flight into a checkpoint and out of it.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import models
from jaxrl_llm.sampling.sampler import left_pad
from jaxrl_llm.sampling.settings import SamplingSettings
from jaxrl_llm.serving import slots
from jaxrl_llm.serving.engine import prompt_columns
from jaxrl_llm.serving.slots import Layout


@dataclasses.dataclass
class Track:
  """A request: the caller's `id`, its `prompt` ids, `budget` new tokens at most, `key`
  (raw key data); while decoding, its prompt's `columns` in the slot and `stretches`,
  (first token index, version) of each run of tokens one version sampled."""
  id: int
  prompt: list[int]
  budget: int
  key: np.ndarray
  columns: int = 0
  stretches: list[tuple[int, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Finished:
  """An ended request: `tokens` (an EOS included), their behaviour `logprobs`, the policy
  `versions` that sampled them, and `eos` (False: it reached its budget or the context)."""
  id: int
  tokens: list[int]
  logprobs: list[float]
  versions: list[int]
  eos: bool


class PartialEngine:
  """Requests decoded across weight versions in a fixed order (module docstring).

  Args:
    model: the policy on one device (no mesh), version `version`.
    settings: its `SamplingSettings` (temperature, top-p, EOS and pad ids).
    layout: slots, context, page size and chunk steps (`slots.Layout`); its
      `prefill_chunk` is not read: prompts and refills are prefilled whole, each in one
      call before the chunk that follows.
  """

  def __init__(self, model: models.Model, settings: SamplingSettings, layout: Layout,
               version: int = 0):
    if model.mesh is not None:
      raise ValueError("serving.PartialEngine runs on one device; place the model without a "
                       "mesh")
    self.settings, self.layout = settings, layout
    self.model, self.version = model, version
    jit = lambda fn: jax.jit(fn, donate_argnums=(1,), compiler_options=models.COMPILER_OPTIONS)
    self._admit = jit(lambda m, st, *a: slots.admit(m, st, *a, layout, settings))
    self._refill = jit(lambda m, st, *a: slots.refill(m, st, *a, layout, settings))
    self._chunk = jit(lambda m, st, stop: slots.decode_chunk(m, st, stop, layout, settings))
    self._stop = jax.jit(slots.stop, donate_argnums=(0,))
    self._place = jax.jit(slots.place, donate_argnums=(0,))
    self._state = slots.init_state(model, layout, settings)
    self.waiting: collections.deque[Track] = collections.deque()
    self.running: dict[int, Track] = {}
    self.restarted = 0

  def submit(self, id_: int, prompt: list[int], budget: int, key, first: bool = False) -> None:
    """Queues a request after those waiting (`first`: before them)."""
    Q = self.layout.page_size
    if not prompt or -(-len(prompt) // Q) * Q + budget > self.layout.context:
      raise ValueError(f"a prompt of {len(prompt)} tokens (whole pages of {Q}) and budget="
                       f"{budget} new tokens do not fit the context of {self.layout.context}: "
                       "expected at least one prompt token and a larger context")
    track = Track(id_, list(prompt), budget, np.asarray(key, np.uint32))
    if first:
      self.waiting.appendleft(track)
    else:
      self.waiting.append(track)

  def publish(self, model: models.Model, version: int, oldest: int | None = None) -> None:
    """The weights from now on: requests decoding go on under `model` (their keys and values
    recomputed), except those whose first token's version is below `oldest`, which start
    again from their prompt, ahead of the waiting ones."""
    self.model, self.version = model, version
    if not self.running:
      return
    st = self._state
    lengths, tokens = jax.device_get((st.length, st.tokens))
    again = []
    for slot, track in sorted(self.running.items()):
      if oldest is not None and track.stretches[0][1] < oldest:
        self._state = self._stop(self._state, jnp.int32(slot))
        del self.running[slot]
        track.stretches = []
        again.append(track)
        continue
      n = int(lengths[slot])
      self._state = self._refill(model, self._state, jnp.int32(slot),
                                 *self._row(track, tokens[slot, :n - 1]))
      track.stretches.append((n, version))
    self.restarted += len(again)
    self.waiting.extendleft(reversed(again))

  def run(self, stop: Callable[[list[Finished]], bool]) -> list[Finished]:
    """Decodes chunk after chunk until `stop(the requests that just ended)` says so or
    nothing is left; returns the ended requests in the order they ended (within a chunk,
    by slot)."""
    finished: list[Finished] = []
    while self.waiting or self.running:
      self._admit_waiting()
      self._state = self._chunk(self.model, self._state, jnp.asarray(bool(self.waiting)))
      ended = self._ended()
      finished += ended
      if ended and stop(ended):
        break
    return finished

  def snapshot(self) -> dict:
    """The engine's requests as plain data (JSON-ready): the waiting ones in order, and each
    decoding one with its slot, its tokens and log-probs so far. A new engine `restore`s
    them; its next `publish` recomputes their keys and values."""
    st = self._state
    lengths, tokens, logprobs = jax.device_get((st.length, st.tokens, st.logprobs))
    running = []
    for slot, track in sorted(self.running.items()):
      n = int(lengths[slot])
      running.append(dict(_as_data(track), slot=slot, tokens=tokens[slot, :n].tolist(),
                          logprobs=logprobs[slot, :n].tolist()))
    return {"version": self.version, "restarted": self.restarted,
            "waiting": [_as_data(t) for t in self.waiting], "running": running}

  def restore(self, snapshot: dict) -> None:
    """Takes the requests of `snapshot` (of an engine with the same layout and settings)
    into this one, which holds none; call `publish` before `run`."""
    if self.waiting or self.running:
      raise ValueError("restore: the engine already holds requests")
    s, W = self.settings, self.layout.context
    self.restarted = snapshot["restarted"]
    self.waiting.extend(_track(t) for t in snapshot["waiting"])
    for item in snapshot["running"]:
      track, n = _track(item), len(item["tokens"])
      row, mask = self._row(track, np.asarray(item["tokens"][:n - 1], np.int32))
      pad = lambda values, dtype: np.pad(np.asarray(values, dtype), (0, W - n))
      mask_W = np.zeros((W,), np.int32)
      mask_W[:row.shape[1]] = np.asarray(mask)[0]
      self._state = self._place(
          self._state, jnp.int32(item["slot"]),
          (track.key, jnp.float32(s.temperature), jnp.float32(s.top_p), jnp.int32(track.budget)),
          jnp.int32(n), jnp.int32(item["tokens"][-1]), jnp.int32(track.columns),
          jnp.int32(len(track.prompt)), mask_W, pad(item["tokens"], np.int32),
          pad(item["logprobs"], np.float32))
      self.running[item["slot"]] = track

  def _row(self, track: Track, fed: np.ndarray):
    """(tokens, mask) [1, S] of a request's fed columns (prompt, then tokens), right-padded
    to whole pages, a power of two of them while that fits its slot."""
    prompt, prompt_mask = left_pad([track.prompt], track.columns, self.settings.pad_id)
    C, n = track.columns, track.columns + len(fed)
    Q, PP = self.layout.page_size, self.layout.pages_per_slot
    pages = -(-n // Q)
    S = min(1 << (pages - 1).bit_length(), PP) * Q
    tokens, mask = np.full((1, S), self.settings.pad_id, np.int32), np.zeros((1, S), np.int32)
    tokens[0, :C], mask[0, :C] = np.asarray(prompt)[0], np.asarray(prompt_mask)[0]
    tokens[0, C:n], mask[0, C:n] = fed, 1
    return jnp.asarray(tokens), jnp.asarray(mask)

  def _admit_waiting(self) -> None:
    s = self.settings
    free = [m for m in range(self.layout.slots) if m not in self.running]
    while self.waiting and free:
      slot, track = free.pop(0), self.waiting.popleft()
      track.columns = prompt_columns(len(track.prompt), track.budget, self.layout)
      tokens, mask = left_pad([track.prompt], track.columns, s.pad_id)
      self._state = self._admit(self.model, self._state, jnp.int32(slot), tokens, mask,
                                track.key, jnp.float32(s.temperature), jnp.float32(s.top_p),
                                jnp.asarray(False), jnp.int32(track.budget))
      track.stretches = [(0, self.version)]
      self.running[slot] = track

  def _ended(self) -> list[Finished]:
    live = np.asarray(jax.device_get(self._state.live))
    ended = sorted(m for m in self.running if not live[m])
    if not ended:
      return []
    st = self._state
    tokens, logprobs, lengths, eos = jax.device_get((st.tokens, st.logprobs, st.length,
                                                     st.ended_eos))
    out = []
    for m in ended:
      track, n = self.running.pop(m), int(lengths[m])
      versions = np.zeros(n, np.int64)
      for first, version in track.stretches:
        versions[first:] = version
      out.append(Finished(track.id, tokens[m, :n].tolist(), logprobs[m, :n].tolist(),
                          versions.tolist(), bool(eos[m])))
    return out


def _as_data(track: Track) -> dict:
  return {"id": track.id, "prompt": track.prompt, "budget": track.budget,
          "key": track.key.tolist(), "columns": track.columns,
          "stretches": [list(x) for x in track.stretches]}


def _track(data: dict) -> Track:
  return Track(data["id"], list(data["prompt"]), data["budget"],
               np.asarray(data["key"], np.uint32), data["columns"],
               [tuple(x) for x in data["stretches"]])
