"""The serving engine: requests submitted from any thread at any time, decoded together.

```python
engine = serving.Engine(model, sampling_settings, serving.Layout(slots=8, context=1024, ...))
future = engine.submit(serving.Request(prompt=ids, max_tokens=64, temperature=1.0, seed=0))
completion = future.result()   # tokens, behaviour log-probs, finish reason, policy version
engine.publish(new_model, version=3)   # requests admitted from now on run the new weights
engine.close()
```

One thread owns the device state (`slots.SlotState`). It loops: every free slot takes the
next waiting request, the prompts taken are prefilled (`slots.admit`), then one device call
decodes up to `chunk_steps` tokens of every live slot (`slots.decode_chunk`, which returns
early when a request ends and others wait), then the ended requests' tokens are read back
and their futures completed. A request therefore joins the running batch at the next chunk
boundary, never waiting for a batch to fill or to drain; the host reads the device once
per chunk, not once per token.

Prefill budget. With `Layout.prefill_chunk` columns (0: no limit), an engine step prefills
at most that many columns (one call at least), the slots taking requests served oldest
first: a longer prompt (or a continuation's new tokens) goes in pieces, one a step
(`slots.prefill_piece`, then `slots.prefill_last`), while the other slots go on decoding;
its slot decodes once its first token is chosen, with the key, positions and log-probs of
a whole prefill.

Every program has fixed shapes: one decode chunk, one admission per prompt bucket (whole
pages, powers of two), one piece, so nothing compiles after the buckets have been seen.

Sessions. A request of a `session` leaves its slot holding its sequence when it ends (the
slot is free for others, the oldest held one taken first). The session's next request
whose prompt starts with that sequence (prompt and completion) continues it in the same
slot: only its new tokens are prefilled, after the kept keys and values (`slots.prefill_last`),
as the turns of an episode are (`sampling.TurnSampler`). Any other request of the session
is admitted afresh. Publishing weights forgets every held sequence.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import models
from jaxrl_llm.serving import slots
from jaxrl_llm.serving.slots import Layout
from jaxrl_llm.sampling.sampler import left_pad
from jaxrl_llm.sampling.settings import SamplingSettings


class QueueFull(RuntimeError):
  """More requests are waiting than the engine accepts (`max_waiting`)."""


@dataclasses.dataclass
class Request:
  """One completion to sample: `prompt` token ids; at most `max_tokens` new tokens;
  `temperature` (0: greedy) and `top_p`; `seed` (its key is `PRNGKey(seed)`, or `key`
  given as raw key data, which wins); `top_logprobs` alternatives per token (0: none);
  `session`: requests of one conversation (module docstring, "Sessions")."""
  prompt: list[int]
  max_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  seed: int | None = None
  key: np.ndarray | None = None
  top_logprobs: int = 0
  session: str | None = None


@dataclasses.dataclass
class Completion:
  """A request's sample: `tokens` (an EOS included), `logprobs` (behaviour log-probs under
  the request's temperature, before top-p), `top_logprobs` ([(id, log-prob)] per token,
  if asked), `finish_reason` ('stop': an EOS; 'length': its budget or the context) and the
  `policy_version` of the weights that sampled it. An MoE model's `routing`: the experts
  int32 [tokens fed, MoE layers, k] of the slot's sequence in order (the prompt, and with a
  session every earlier turn, then this completion but its last token), else None."""
  tokens: list[int]
  logprobs: list[float]
  top_logprobs: list[list[tuple[int, float]]] | None
  finish_reason: str
  policy_version: int
  routing: np.ndarray | None = None


def prompt_columns(length: int, budget: int, layout: Layout) -> int:
  """Columns a prompt of `length` tokens is left-padded to: whole pages, a power of two of
  them if that leaves room for `budget` new tokens, else the fewest that hold it."""
  Q = layout.page_size
  pages = -(-max(length, 1) // Q)
  bucket = 1 << (pages - 1).bit_length()
  return (bucket if bucket * Q + budget <= layout.context else pages) * Q


@dataclasses.dataclass
class _Prefill:
  """A request taken into a slot whose first token is not yet chosen: `tokens`, `mask`
  [1, C] (its left-padded prompt, or a continuation's new tokens) go to the slot's columns
  from `column` on, the first real one at `position` (`fresh`: nothing before it is kept);
  the first `fed` columns are in. `take`: the device arguments of its first token."""
  request: Request
  future: concurrent.futures.Future
  tokens: np.ndarray
  mask: np.ndarray
  column: int
  position: int
  fresh: bool
  take: tuple
  fed: int = 0

  def piece(self, size: int) -> tuple[int, int]:
    """The columns of `tokens` the next call prefills: all of them if `size` is 0 or they
    fit, else `size` from `fed` on, the last piece ending at the last column."""
    C = self.tokens.shape[1]
    if not size or C <= size:
      return 0, C
    start = min(self.fed, C - size)
    return start, start + size


class Engine:
  """Continuous batching for requests that arrive at any time; see the module docstring.

  Args:
    model: the policy, on one device (no mesh).
    settings: its `SamplingSettings` (the decode loop's layout, `eos_ids`, `pad_id`; the
      per-request fields `temperature`, `top_p` and the budget come with each request).
    layout: slots, context, page size, chunk steps, top log-probs, prefill budget
      (`slots.Layout`).
    max_waiting: requests that may wait for a slot; one more raises `QueueFull`.
    version: the policy version of `model`.
  """

  def __init__(self, model: models.Model, settings: SamplingSettings, layout: Layout,
               max_waiting: int = 1024, version: int = 0):
    if model.mesh is not None:
      raise ValueError("serving.Engine runs on one device; place the model without a mesh")
    self.settings, self.layout, self.max_waiting = settings, layout, max_waiting
    self._model, self.version = model, version
    self._admit = jax.jit(lambda m, st, *a: slots.admit(m, st, *a, layout, settings),
                          donate_argnums=(1,), compiler_options=models.COMPILER_OPTIONS)
    self._piece = jax.jit(lambda m, st, *a: slots.prefill_piece(m, st, *a, layout, settings),
                          donate_argnums=(1,), compiler_options=models.COMPILER_OPTIONS)
    self._last = jax.jit(lambda m, st, *a: slots.prefill_last(m, st, *a, layout, settings),
                         donate_argnums=(1,), compiler_options=models.COMPILER_OPTIONS)
    self._chunk = jax.jit(lambda m, st, stop: slots.decode_chunk(m, st, stop, layout, settings),
                          donate_argnums=(1,), compiler_options=models.COMPILER_OPTIONS)
    self._state = slots.init_state(model, layout, settings)
    self._waiting: collections.deque = collections.deque()
    self._running: dict[int, tuple[Request, concurrent.futures.Future, int]] = {}
    # Slots holding an ended session request's sequence: slot -> (session, its tokens, the
    # next free column), oldest first.
    self._held: dict[int, tuple[str, list[int], int]] = {}
    self._columns: dict[int, int] = {}  # a running request's prompt columns
    self._prefilling: dict[int, _Prefill] = {}  # slots taking a request, oldest first
    self._wake = threading.Condition()
    self._closed = False
    self._paused = False  # a publish waits for the running requests: admit none
    # pieces: prefill calls that chose no token (a long prompt's but its last)
    self.stats = {"chunks": 0, "admitted": 0, "extended": 0, "pieces": 0, "completed": 0,
                  "tokens": 0}
    self._thread = threading.Thread(target=self._loop, name="serving-engine", daemon=True)
    self._thread.start()

  # -- the caller's side ------------------------------------------------------------------

  def check(self, request: Request) -> None:
    """Raises ValueError naming the field if `request` cannot run on this engine."""
    n, budget, W = len(request.prompt), request.max_tokens, self.layout.context
    if n < 1:
      raise ValueError("prompt: expected at least one token")
    V = self._model.config.vocab_size
    bad = [t for t in request.prompt if not 0 <= t < V]
    if bad:
      raise ValueError(f"prompt: token id {bad[0]} is outside the vocabulary [0, {V})")
    if budget < 1:
      raise ValueError(f"max_tokens={budget}: expected >= 1")
    if -(-n // self.layout.page_size) * self.layout.page_size + budget > W:
      raise ValueError(f"the prompt's {n} tokens and max_tokens={budget} do not fit the "
                       f"context of {W} tokens (prompts take whole pages of "
                       f"{self.layout.page_size}): expected a shorter prompt or fewer tokens")
    if request.temperature < 0 or not 0 < request.top_p <= 1:
      raise ValueError(f"temperature={request.temperature}, top_p={request.top_p}: expected "
                       "temperature >= 0 and 0 < top_p <= 1")
    if not 0 <= request.top_logprobs <= self.layout.top_logprobs:
      raise ValueError(f"top_logprobs={request.top_logprobs}: expected 0..{self.layout.top_logprobs}")

  def submit(self, request: Request) -> concurrent.futures.Future:
    """Queues `request`; its future completes with a `Completion` (or the error it met)."""
    self.check(request)
    future: concurrent.futures.Future = concurrent.futures.Future()
    with self._wake:
      if self._closed:
        raise RuntimeError("the engine is closed")
      if len(self._waiting) >= self.max_waiting:
        raise QueueFull(f"{len(self._waiting)} requests are waiting (max_waiting="
                        f"{self.max_waiting})")
      self._waiting.append((request, future))
      self._wake.notify()
    return future

  def publish(self, model: models.Model, version: int, after_running: bool = False) -> None:
    """The weights of every device call from now on: `model` (the policy's `version`).
    A completion reports the version that chose its first token; one still decoding (or
    still being prefilled) at a publish takes its later tokens (pieces) from the new
    weights, unless `after_running`: then no request is admitted until those decoding or
    being prefilled have ended, and the call returns once the new
    weights are in place, so every completion is sampled by one version (partial
    episodes publish so, between turns)."""
    with self._wake:
      if after_running:
        self._paused = True
        while (self._running or self._prefilling) and not self._closed:
          self._wake.wait()
        self._paused = False
        self._wake.notify_all()
      self._model, self.version = model, version
      self._held.clear()

  def release(self, session: str) -> None:
    """Forgets the sequence a session's slot holds (the slot stays free for others)."""
    with self._wake:
      for m in [m for m, held in self._held.items() if held[0] == session]:
        del self._held[m]

  @property
  def busy(self) -> int:
    """Requests waiting or decoding."""
    with self._wake:
      return len(self._waiting) + len(self._prefilling) + len(self._running)

  def close(self) -> None:
    """Stops the engine; requests still waiting or decoding fail (idempotent)."""
    with self._wake:
      self._closed = True
      self._wake.notify_all()
    self._thread.join()
    with self._wake:
      pending = ([f for _, f in self._waiting] + [p.future for p in self._prefilling.values()]
                 + [f for _, f, _ in self._running.values()])
      self._waiting.clear()
      self._prefilling.clear()
      self._running.clear()
    for future in pending:
      if not future.done():
        future.set_exception(RuntimeError("the engine was closed"))

  # -- the engine's thread ----------------------------------------------------------------

  def _loop(self) -> None:
    try:
      while True:
        with self._wake:
          while (not self._closed and (self._paused or not self._waiting) and not self._running
                 and not self._prefilling):
            self._wake.wait()
          if self._closed:
            return
          model, version = self._model, self.version
          for slot, request, future in [] if self._paused else self._take_waiting():
            self._prefilling[slot] = self._plan(slot, request, future)
        self._prefill(model, version)
        with self._wake:
          waiting = bool(self._waiting) and not self._paused
        self._state = self._chunk(model, self._state, jnp.asarray(waiting))
        self.stats["chunks"] += 1
        self._deliver()
    except Exception as e:  # pylint: disable=broad-except
      with self._wake:
        self._closed = True
        self._wake.notify_all()
        pending = (list(self._waiting) + [(p.request, p.future) for p in self._prefilling.values()]
                   + [(r, f) for r, f, _ in self._running.values()])
        self._waiting.clear()
        self._prefilling.clear()
        self._running.clear()
      for _, future in pending:
        if not future.done():
          future.set_exception(e)

  def _take_waiting(self):
    """(slot, request, future) for waiting requests while a slot is free: a session's own
    held slot, else a slot holding nothing, else the oldest held one."""
    taken = []
    while self._waiting:
      free = [m for m in range(self.layout.slots) if m not in self._running
              and m not in self._prefilling and m not in (t[0] for t in taken)]
      if not free:
        break
      request, future = self._waiting.popleft()
      if not future.set_running_or_notify_cancel():
        continue
      own = [m for m in free if request.session is not None and m in self._held
             and self._held[m][0] == request.session]
      empty = [m for m in free if m not in self._held]
      slot = (own or empty or sorted(free, key=list(self._held).index))[0]
      taken.append((slot, request, future))
    return taken

  def _key(self, request: Request) -> np.ndarray:
    if request.key is not None:
      return np.asarray(request.key, np.uint32)
    seed = request.seed if request.seed is not None else int.from_bytes(os.urandom(4), "little")
    return np.asarray(jax.random.PRNGKey(seed))

  def _continuation(self, slot: int, request: Request):
    """(new tokens, first column) if `slot` holds a sequence `request` continues and its new
    tokens and budget fit after it, else None."""
    held = self._held.pop(slot, None)
    if held is None or held[0] != request.session:
      return None
    _, sequence, column = held
    if request.prompt[:len(sequence)] != sequence:
      return None
    new = request.prompt[len(sequence) - 1:]  # the last sampled token was never fed
    width = 1 << (len(new) - 1).bit_length()
    if column + width + request.max_tokens > self.layout.context:
      return None
    return new, width, column

  def _plan(self, slot: int, request: Request, future) -> _Prefill:
    """`request`'s prefill into `slot`: its new tokens after the sequence the slot holds if
    it continues it, else its whole prompt (the caller holds the lock)."""
    take = (self._key(request), jnp.float32(request.temperature), jnp.float32(request.top_p),
            jnp.asarray(request.top_logprobs > 0), jnp.int32(request.max_tokens))
    found = self._continuation(slot, request)
    if found is not None:
      new, width, column = found
      tokens, mask = left_pad([new], width, self.settings.pad_id)
      # The held sequence's last token (the first of `new`) is at position len(sequence) - 1.
      return _Prefill(request, future, np.asarray(tokens), np.asarray(mask), column,
                      len(request.prompt) - len(new), False, take)
    columns = prompt_columns(len(request.prompt), request.max_tokens, self.layout)
    tokens, mask = left_pad([request.prompt], columns, self.settings.pad_id)
    return _Prefill(request, future, np.asarray(tokens), np.asarray(mask), 0, 0, True, take)

  def _prefill(self, model, version: int) -> None:
    """One engine step's prefill calls: the slots taking requests, oldest first, one call
    each, within `Layout.prefill_chunk` columns (one call at least). A slot whose first
    token is chosen joins the running ones."""
    budget, spent = self.layout.prefill_chunk, 0
    for slot, fill in list(self._prefilling.items()):
      start, end = fill.piece(budget)
      if spent and budget and spent + end - start > budget:
        break
      spent += end - start
      self._state = self._prefill_call(model, slot, fill, start, end)
      fill.fed = end
      if end == fill.tokens.shape[1]:
        with self._wake:
          del self._prefilling[slot]
          self._running[slot] = (fill.request, fill.future, version)
          self._columns[slot] = fill.column + end

  def _prefill_call(self, model, slot: int, fill: _Prefill, start: int, end: int):
    """The device call prefilling columns [start, end) of `fill` into `slot`: a whole new
    prompt by `slots.admit`, else a piece; the last one chooses the first token."""
    last, fresh = end == fill.tokens.shape[1], fill.fresh and start == 0
    tokens, mask = fill.tokens[:, start:end], fill.mask[:, start:end]
    if last and fresh:
      self.stats["admitted"] += 1
      return self._admit(model, self._state, jnp.int32(slot), tokens, mask, *fill.take)
    where = (jnp.int32(slot), tokens, mask, jnp.int32(fill.column + start),
             jnp.int32(fill.position + int(fill.mask[0, :start].sum())), jnp.asarray(fresh))
    if not last:
      self.stats["pieces"] += 1
      return self._piece(model, self._state, *where)
    self.stats["admitted" if fill.fresh else "extended"] += 1
    return self._last(model, self._state, *where, fill.take)

  def _deliver(self) -> None:
    """Completes the futures of the requests that ended."""
    live = np.asarray(jax.device_get(self._state.live))
    ended = [m for m in self._running if not live[m]]
    if not ended:
      return
    st = self._state
    want_top = any(self._running[m][0].top_logprobs for m in ended)
    rows = jnp.asarray(ended)  # an MoE record is large: only the ended slots' rows come back
    tokens, logprobs, lengths, eos, top, record = jax.device_get(
        (st.tokens, st.logprobs, st.length, st.ended_eos,
         (st.top_ids, st.top_logprobs) if want_top else None,
         None if st.routing is None else (st.mask[rows], st.routing[rows])))
    fed_experts = {} if record is None else {
        m: routing[mask > 0] for m, mask, routing in zip(ended, *record)}
    for m in ended:
      n = int(lengths[m])
      with self._wake:
        request, future, version = self._running.pop(m)
        self._wake.notify_all()  # a publish may wait for the running requests
        if request.session is not None and n:  # its sequence stays for the session's next
          self._held[m] = (request.session, list(request.prompt) + tokens[m, :n].tolist(),
                           self._columns[m] + n - 1)
      alternatives = None
      if request.top_logprobs:
        k = request.top_logprobs
        alternatives = [list(zip(top[0][m, t, :k].tolist(), top[1][m, t, :k].tolist()))
                        for t in range(n)]
      self.stats["completed"] += 1
      self.stats["tokens"] += n
      future.set_result(Completion(tokens[m, :n].tolist(), logprobs[m, :n].tolist(),
                                   alternatives, "stop" if eos[m] else "length", version,
                                   fed_experts.get(m)))
