"""The serving engine's device programs: M decode slots over a paged KV cache, each slot
holding one request from its admission to its end, requests admitted whenever a slot is
free (`engine.Engine` drives them from the host).

Layout. Slot m owns the pages [m * PP, (m + 1) * PP) of the pool (PP = context / Q), so its
block table is fixed and a request never waits for memory. A request's prompt is
left-padded to a bucket of whole pages and prefilled into the slot's first pages
(`admit`); its completion follows, one token per decode step (`decode_chunk`), at its own
position, as in the continuous engine (`sampling.continuous`): attention reads the leading
pages of every slot's table, as many as the longest live sequence of its group needs, and
a step runs the smallest of `sampling.paged.batch_sizes` that holds the live slots.

Pieces. A prompt longer than `Layout.prefill_chunk` columns is prefilled in pieces of that
many (`prefill_piece`, then `prefill_last`), each reading the keys and values of the ones
before from the slot's pages, the slot idle (not live) until the last has chosen its first
token. The pieces start every `prefill_chunk` columns, the last one ending at the prompt's
last column (overlapping the one before when the prompt's columns are not a multiple of the
piece: those columns are computed again, to the same keys and values), so every piece has
one shape and the logits come from its last column. A piece reads the slot's whole context
(one program for every prompt), where `admit` reads only the prompt: whole prompts that fit
one piece go through `admit`.

Tokens. A request draws its token of column t from `choose.token_keys(key, t)` with its
own temperature and top-p (`choose.choose_rows`): what it samples depends on its key, its
prompt and the weights, not on its slot, its neighbours or when it was admitted; with the
key of row r of a static-engine call (`choose.request_keys`) and that call's settings, it
is that row's completion.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm import models
from jaxrl_llm.models import kv_cache
from jaxrl_llm.sampling import choose, decode, paged
from jaxrl_llm.sampling.settings import SamplingSettings


@dataclasses.dataclass(frozen=True)
class Layout:
  """The engine's static shapes: `slots` M, `context` tokens per slot (prompt and
  completion; a multiple of `page_size`), `chunk_steps` decode steps per device call at
  most, `top_logprobs` the most alternatives per token a request may ask for,
  `prefill_chunk` the most prompt columns prefilled per engine step (0: a whole prompt at
  once; else whole pages: a longer prompt goes in pieces between decode chunks, so it does
  not stall the slots decoding)."""
  slots: int
  context: int
  page_size: int
  chunk_steps: int
  top_logprobs: int
  prefill_chunk: int = 0

  def __post_init__(self):
    for name in ("slots", "context", "page_size", "chunk_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: expected >= 1")
    if self.context % self.page_size:
      raise ValueError(f"context={self.context}: expected a multiple of page_size="
                       f"{self.page_size}")
    if not 0 <= self.top_logprobs <= 20:
      raise ValueError(f"top_logprobs={self.top_logprobs}: expected 0..20")
    if self.prefill_chunk < 0 or self.prefill_chunk % self.page_size:
      raise ValueError(f"prefill_chunk={self.prefill_chunk}: expected 0 (whole prompts) or a "
                       f"positive multiple of page_size={self.page_size}")

  @property
  def pages_per_slot(self) -> int:
    return self.context // self.page_size

  @property
  def spare_page(self) -> int:  # written by slots without a request, read by none
    return self.slots * self.pages_per_slot


@struct.dataclass
class SlotState:
  """Every slot's request, on the device between calls (donated to each).

  live: bool [M], a request is decoding; ended_eos: bool [M], the last one ended by EOS.
  length: int32 [M], tokens chosen; budget: int32 [M], its most new tokens.
  token: int32 [M], the last chosen token (fed by the next step).
  prompt_cols: int32 [M], columns of its left-padded prompt (the first generated column).
  position: int32 [M], the position of its first generated token (its prompt's length).
  keys: its key; temperature, top_p: float32 [M]; want_top: bool [M], records alternatives.
  mask: int32 [M, W], the columns its attention reads (prompt and fed tokens).
  tokens, logprobs: [M, W], what it chose; top_ids, top_logprobs: [M, W, TL].
  routing: an MoE model's experts int32 [M, W, MoE layers, k] of the token each column holds,
    once fed (-1: none; routing replay's record), else None.
  """
  live: jax.Array
  ended_eos: jax.Array
  length: jax.Array
  budget: jax.Array
  token: jax.Array
  prompt_cols: jax.Array
  position: jax.Array
  keys: jax.Array
  temperature: jax.Array
  top_p: jax.Array
  want_top: jax.Array
  mask: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  top_ids: jax.Array
  top_logprobs: jax.Array
  pool: dict | tuple
  routing: jax.Array | None = None


def init_state(model: models.Model, layout: Layout, s: SamplingSettings) -> SlotState:
  """Empty slots and a zeroed pool for `model` (its decode layout: `decode.tuning`)."""
  M, W, TL = layout.slots, layout.context, max(layout.top_logprobs, 1)
  pool = kv_cache.init_pages(model.config, layout.spare_page + 1, layout.page_size,
                             model.config.jnp_dtype, decode.tuning(model).key_layout)
  if decode.unrolls_layers(s, model):
    pool = decode.per_layer(pool)
  zeros = lambda dtype, *shape: jnp.zeros((M,) + shape, dtype)
  return SlotState(
      live=zeros(bool), ended_eos=zeros(bool), length=zeros(jnp.int32), budget=zeros(jnp.int32),
      token=zeros(jnp.int32), prompt_cols=zeros(jnp.int32), position=zeros(jnp.int32),
      keys=jnp.zeros((M,) + jax.random.PRNGKey(0).shape, jnp.uint32),
      temperature=jnp.ones((M,), jnp.float32), top_p=jnp.ones((M,), jnp.float32),
      want_top=zeros(bool), mask=zeros(jnp.int32, W), tokens=jnp.full((M, W), s.pad_id, jnp.int32),
      logprobs=zeros(jnp.float32, W), top_ids=zeros(jnp.int32, W, TL),
      top_logprobs=zeros(jnp.float32, W, TL), pool=pool,
      routing=decode.empty_record(model.config, M, W) if model.config.is_moe else None)


def _record(st: SlotState, live_M, token_M, logp_M, logp_MV, layout: Layout, s: SamplingSettings):
  """Writes each live slot's chosen token (and its alternatives) at its next column, and
  ends the slots whose request is done (EOS or its budget)."""
  M, W = st.live.shape[0], st.tokens.shape[1]
  row_M = jnp.where(live_M, jnp.arange(M), M)  # out of range: dropped
  col_M = st.length
  st = st.replace(tokens=st.tokens.at[row_M, col_M].set(token_M, mode="drop"),
                  logprobs=st.logprobs.at[row_M, col_M].set(logp_M, mode="drop"))
  if layout.top_logprobs:
    def top(st):
      lp_MT, ids_MT = jax.lax.top_k(logp_MV, st.top_ids.shape[-1])
      wanted_M = jnp.where(st.want_top, row_M, M)
      return st.replace(top_ids=st.top_ids.at[wanted_M, col_M].set(ids_MT, mode="drop"),
                        top_logprobs=st.top_logprobs.at[wanted_M, col_M].set(lp_MT, mode="drop"))
    st = jax.lax.cond(jnp.any(live_M & st.want_top), top, lambda st: st, st)
  length_M = jnp.where(live_M, col_M + 1, col_M)
  eos_M = live_M & choose.is_eos(token_M, s)
  done_M = live_M & (eos_M | (length_M >= st.budget) | (st.prompt_cols + length_M >= W))
  return st.replace(length=length_M, token=jnp.where(live_M, token_M, st.token),
                    live=st.live & ~done_M, ended_eos=jnp.where(done_M, eos_M, st.ended_eos))


def admit(model: models.Model, st: SlotState, slot, tokens_1S, mask_1S, key, temperature,
          top_p, want_top, budget, layout: Layout, s: SamplingSettings) -> SlotState:
  """Slot `slot` takes a request: its prompt (left-padded to S, a multiple of the page size)
  prefilled into the slot's first pages, its first token chosen."""
  unrolled = isinstance(st.pool, tuple)
  model, tune = decode.decode_model(model, s, unrolled)
  S, W = tokens_1S.shape[1], layout.context
  moe = st.routing is not None
  cache, logits_1V, positions_1S, *experts = decode.prefill(model, tokens_1S, mask_1S, tune,
                                                            unrolled, with_router=moe)
  pool = kv_cache.put_pages(st.pool, kv_cache.as_pages(cache, layout.page_size),
                    slot * layout.pages_per_slot)
  mask_W = jnp.zeros((W,), jnp.int32).at[:S].set(mask_1S[0])
  if moe:  # the slot's record starts afresh
    st = st.replace(routing=st.routing.at[slot].set(-1))
    st = st.replace(routing=decode.record_experts(st.routing, experts[0], mask_1S > 0,
                                                  (slot, 0, 0, 0)))
  return _take(st.replace(pool=pool), slot, logits_1V, S, positions_1S[0, -1] + 1, mask_W,
               (key, temperature, top_p, want_top, budget), layout, s)


def prefill_piece(model: models.Model, st: SlotState, slot, tokens_1C, mask_1C, column,
                  position, fresh, layout: Layout, s: SamplingSettings) -> SlotState:
  """C tokens of slot `slot`'s sequence prefilled at its columns [column, column + C), its
  first real one (`mask_1C`) at `position`, reading the keys and values the slot holds before
  `column` (none if `fresh`: a new prompt). The slot stays idle: a long prompt goes in piece
  by piece between decode chunks, its last piece by `prefill_last`."""
  return _piece(model, st, slot, tokens_1C, mask_1C, column, position, fresh, layout, s)[0]


def prefill_last(model: models.Model, st: SlotState, slot, tokens_1C, mask_1C, column,
                 position, fresh, request, layout: Layout, s: SamplingSettings) -> SlotState:
  """`prefill_piece` of a sequence's last C tokens (its last column real), then the slot
  takes the request: its first token is chosen from the logits after them. A session's
  continuation is one such call (its new tokens, the last sampled one first, left-padded,
  after the kept sequence); a long prompt's pieces end with one.
  `request`: (key, temperature, top_p, want_top, budget)."""
  st, logits_1V = _piece(model, st, slot, tokens_1C, mask_1C, column, position, fresh, layout, s)
  return _take(st, slot, logits_1V, column + tokens_1C.shape[1], position + jnp.sum(mask_1C),
               st.mask[slot], request, layout, s)


def _piece(model, st: SlotState, slot, tokens_1C, mask_1C, column, position, fresh,
           layout: Layout, s: SamplingSettings):
  """`prefill_piece`'s forward: (the state, the logits after the piece's last token [1, V]).
  The slot's mask takes the piece's columns; its pages are rewritten whole."""
  unrolled = isinstance(st.pool, tuple)
  model, tune = decode.decode_model(model, s, unrolled)
  PP = layout.pages_per_slot
  own = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, slot * PP, PP, x.ndim - 4),
                     st.pool)
  kept_1W = jnp.where(fresh, 0, st.mask[slot])[None]  # a new prompt reads none of the old
  mask_1W = jax.lax.dynamic_update_slice(kept_1W, mask_1C, (0, column))
  positions_1C = jnp.where(mask_1C > 0, position + jnp.cumsum(mask_1C, axis=1) - 1, 0)
  moe = st.routing is not None
  hidden_1CD, cache, *routed = decode.forward(model, tokens_1C, positions_1C, mask_1W,
                                              kv_cache.from_pages(own, 1), column, tune=tune,
                                              return_hidden=True, with_router=moe)
  logits_1V = models.unembed(model, hidden_1CD[:, -1:])[:, 0]
  if moe:  # a new prompt's record starts afresh
    routing = st.routing.at[slot].set(jnp.where(fresh, -1, st.routing[slot]))
    st = st.replace(routing=decode.record_experts(routing, routed[0]["experts"], mask_1C > 0,
                                                  (slot, column, 0, 0)))
  pool = kv_cache.put_pages(st.pool, kv_cache.as_pages(kv_cache.own_part(cache), layout.page_size),
                            slot * PP)
  return st.replace(pool=pool, mask=st.mask.at[slot].set(mask_1W[0])), logits_1V


def refill(model: models.Model, st: SlotState, slot, tokens_1S, mask_1S, layout: Layout,
           s: SamplingSettings) -> SlotState:
  """Slot `slot`'s keys and values recomputed under `model` (new weights) for the columns it
  has fed: `tokens_1S`, `mask_1S` are its row as admitted (the left-padded prompt, then its
  chosen tokens but the last, right-padded to S columns, a multiple of the page size); the
  request goes on decoding from its last chosen token, which the next step feeds."""
  unrolled = isinstance(st.pool, tuple)
  model, tune = decode.decode_model(model, s, unrolled)
  cache, _, _ = decode.prefill(model, tokens_1S, mask_1S, tune, unrolled)
  return st.replace(pool=kv_cache.put_pages(st.pool, kv_cache.as_pages(cache, layout.page_size),
                                            slot * layout.pages_per_slot))


def place(st: SlotState, slot, request, length, token, prompt_cols, position, mask_W, tokens_W,
          logprobs_W) -> SlotState:
  """Slot `slot` holds a request restored mid-way (`length` tokens chosen, the last `token`
  not yet fed), its keys and values not yet computed: `refill` them before decoding.
  `request`: (key, temperature, top_p, budget)."""
  key, temperature, top_p, budget = request
  at = lambda x, v: x.at[slot].set(v)
  return st.replace(
      live=at(st.live, True), ended_eos=at(st.ended_eos, False), length=at(st.length, length),
      budget=at(st.budget, budget), token=at(st.token, token),
      prompt_cols=at(st.prompt_cols, prompt_cols), position=at(st.position, position),
      keys=at(st.keys, key), temperature=at(st.temperature, temperature),
      top_p=at(st.top_p, top_p), want_top=at(st.want_top, False), mask=at(st.mask, mask_W),
      tokens=at(st.tokens, tokens_W), logprobs=at(st.logprobs, logprobs_W))


def stop(st: SlotState, slot) -> SlotState:
  """Slot `slot`'s request is dropped (the slot is free; its tokens are not read)."""
  return st.replace(live=st.live.at[slot].set(False))


def _take(st: SlotState, slot, logits_1V, prompt_cols, position, mask_W, request, layout,
          s) -> SlotState:
  """Slot `slot` starts a request whose prompt fills its first `prompt_cols` columns
  (`mask_W`), its next position `position`: the first token chosen from `logits_1V`."""
  key, temperature, top_p, want_top, budget = request
  at = lambda x, v: x.at[slot].set(v)
  st = st.replace(
      live=at(st.live, True), ended_eos=at(st.ended_eos, False), length=at(st.length, 0),
      budget=at(st.budget, budget), prompt_cols=at(st.prompt_cols, prompt_cols),
      position=at(st.position, position), keys=at(st.keys, key),
      temperature=at(st.temperature, temperature), top_p=at(st.top_p, top_p),
      want_top=at(st.want_top, want_top), mask=at(st.mask, mask_W))
  M = st.live.shape[0]
  token_M, logp_M, logp_MV = _choose(jnp.broadcast_to(logits_1V, (M,) + logits_1V.shape[1:]), st)
  return _record(st, jnp.arange(M) == slot, token_M, logp_M, logp_MV, layout, s)


def _choose(logits_MV, st: SlotState):
  """Every slot's next token from its own key, temperature and top-p."""
  return choose.choose_rows(logits_MV, choose.token_keys(st.keys, st.length), st.temperature,
                            st.top_p)


def decode_chunk(model: models.Model, st: SlotState, stop_on_end, layout: Layout,
                 s: SamplingSettings) -> SlotState:
  """Up to `chunk_steps` decode steps of every live slot; stops early when no slot is live,
  or, with `stop_on_end` (requests are waiting), when a slot's request has ended."""
  unrolled = isinstance(st.pool, tuple)
  model, tune = decode.decode_model(model, s, unrolled)

  def running(carry):
    k, st, live_at_start = carry
    ended = jnp.any(live_at_start & ~st.live)
    return (k < layout.chunk_steps) & jnp.any(st.live) & ~(stop_on_end & ended)

  def step(carry):
    k, st, live_at_start = carry
    return k + 1, _decode_step(model, tune, st, layout, s), live_at_start

  _, st, _ = jax.lax.while_loop(running, step, (jnp.int32(0), st, st.live))
  return st


def _decode_step(model, tune, st: SlotState, layout: Layout, s: SamplingSettings) -> SlotState:
  """Feeds every live slot's last token and chooses its next one."""
  M, Q, PP = layout.slots, layout.page_size, layout.pages_per_slot
  live_M = st.live
  col_M = st.prompt_cols + jnp.maximum(st.length - 1, 0)  # the fed token's column
  write_page_M = jnp.where(live_M, jnp.arange(M) * PP + col_M // Q, layout.spare_page)
  table_MP = jnp.arange(M)[:, None] * PP + jnp.arange(PP)[None]
  positions_M = st.position + jnp.maximum(st.length - 1, 0)
  in_place = not isinstance(st.pool, tuple) and tune.key_layout == "slot_major"
  moe = st.routing is not None
  logits_MV, (k_new, v_new), experts_MLk = paged.decode_slots(
      model, tune, st.pool, tokens_M=st.token, positions_M=positions_M, valid_MS=st.mask,
      live_M=live_M, pages_M=jnp.where(live_M, col_M // Q + 1, 0), table_MP=table_MP,
      prompt_pages=0, in_place=in_place, moe=moe, choose=lambda logits_bV, at_b: logits_bV)
  pool = kv_cache.write_pages(st.pool, k_new, v_new, write_page_M, col_M % Q)
  fed_M = jnp.zeros_like(st.mask).at[jnp.arange(M), col_M].set(live_M.astype(jnp.int32))
  st = st.replace(pool=pool, mask=st.mask | fed_M)
  if moe:
    row_M = jnp.where(live_M, jnp.arange(M), M)  # out of range: dropped
    st = st.replace(routing=st.routing.at[row_M, col_M].set(experts_MLk.astype(jnp.int32),
                                                            mode="drop"))
  token_M, logp_M, logp_MV = _choose(logits_MV, st)
  return _record(st, live_M, token_M, logp_M, logp_MV, layout, s)
