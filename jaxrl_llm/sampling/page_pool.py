"""The continuous engine's state (`EngineState`) and its pages: how many an engine keeps for
completions (`own_pages`), which each slot holds, the free stack they are taken from and
given back to, and preemption, which frees pages for the running slots when the pool,
smaller than every slot's worst case (`SamplingSettings.kv_pages`), has none left
(`continuous`, "Fewer pages")."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm.sampling.settings import SamplingSettings


def own_pages(s: SamplingSettings, slots: int) -> int:
  """The pages an engine of `slots` slots keeps for completions: `s.kv_pages`, or (0, or
  more) every slot's worst case, `slots` x ceil(max_new_tokens / page_size)."""
  worst = slots * -(-s.max_new_tokens // s.page_size)
  return min(s.kv_pages, worst) if s.kv_pages else worst


def admission_reserve(pages: int, slots: int, s: SamplingSettings) -> int:
  """The free pages an empty slot leaves to the running slots' growth when it takes a
  request (vLLM's watermark): none with every slot's worst case (nothing waits), else 1%
  of the `pages`, at least one."""
  return 0 if pages >= own_pages(dataclasses.replace(s, kv_pages=0), slots) else max(
      1, pages // 100)


@struct.dataclass
class EngineState:
  """What the continuous engine's loop carries from step to step (M slots, R requests)."""
  slot_request: jax.Array   # int32 [M], the request in the slot, -1 when empty
  slot_chosen: jax.Array    # int32 [M], tokens chosen so far for it
  slot_token: jax.Array     # int32 [M], the last chosen token (fed by the next step)
  slot_admitted: jax.Array  # int32 [M], when its request was admitted (an admission count)
  block_table: jax.Array    # int32 [M, PP], prompt pages then own pages
  free_pages: jax.Array     # int32 [own_pages], a stack of free own pages
  free_count: jax.Array     # int32, how many of `free_pages` are free (the stack's top)
  queue_R: jax.Array        # int32 [R], requests in admission order: queue_R[queue_head:] wait
  queue_head: jax.Array     # int32, the queue's first waiting request
  admissions: jax.Array     # int32, requests admitted so far (restarts counted again)
  tokens_RN: jax.Array
  logprobs_RN: jax.Array
  lengths_R: jax.Array
  ended_R: jax.Array        # bool [R], ended by an EOS
  pool: dict | tuple
  steps: jax.Array          # int32, decode steps run
  peak_pages: jax.Array     # int32, the most own pages in use at once
  preemptions: jax.Array    # int32, running requests evicted to free pages
  routing_RNLk: jax.Array | None = None  # an MoE model's experts of each fed token, -1: none


def held_pages(st: EngineState, Q: int):
  """int32 [M]: the own pages each slot holds, one per page its fed tokens reach (the last
  chosen token is never fed)."""
  return jnp.where(st.slot_request >= 0, -(-(st.slot_chosen - 1) // Q), 0)


def empty_slots(st: EngineState, out_M, prompt_pages: int, Q: int):
  """Empties the slots `out_M`: their own pages back on the free stack."""
  own_MO = st.block_table[:, prompt_pages:]
  used_MO = out_M[:, None] & (jnp.arange(own_MO.shape[1])[None] < held_pages(st, Q)[:, None])
  used = used_MO.reshape(-1)
  at = jnp.where(used, st.free_count + jnp.cumsum(used) - 1, st.free_pages.shape[0])
  return st.replace(
      free_pages=st.free_pages.at[at].set(own_MO.reshape(-1), mode="drop"),
      free_count=st.free_count + jnp.sum(used, dtype=jnp.int32),
      slot_request=jnp.where(out_M, -1, st.slot_request))


def opens_page(st: EngineState, Q: int):
  """bool [M]: the live slots whose next fed token opens a page (the next step takes one)."""
  return (st.slot_request >= 0) & ((st.slot_chosen - 1) % Q == 0)


def preempt(st: EngineState, prompt_pages: int, Q: int, pad_id: int) -> EngineState:
  """Frees pages for the slots whose next token opens one: evicts the running requests
  admitted last, as few as make room (never the oldest: the pool holds one completion's
  worst case), their pages freed, their rows cleared and their requests back at the front
  of the queue, in admission order, to start again from their prompts."""
  M, R = st.slot_request.shape[0], st.lengths_R.shape[0]
  live_M, opens_M = st.slot_request >= 0, opens_page(st, Q)
  order_M = jnp.argsort(jnp.where(live_M, -st.slot_admitted, 1), stable=True)  # latest first
  zero = jnp.zeros((1,), jnp.int32)
  freed_k = jnp.concatenate([zero, jnp.cumsum(held_pages(st, Q)[order_M])])  # [M + 1]
  unneeded_k = jnp.concatenate([zero, jnp.cumsum(opens_M[order_M])])
  # The first k whose eviction leaves enough (both sums grow with k).
  evicted = jnp.sum(st.free_count + freed_k < jnp.sum(opens_M) - unneeded_k, dtype=jnp.int32)
  rank_M = jnp.zeros((M,), jnp.int32).at[order_M].set(jnp.arange(M, dtype=jnp.int32))
  out_M = live_M & (rank_M < evicted)
  row_M = jnp.where(out_M, st.slot_request, R)  # out of range: dropped
  st = st.replace(
      queue_R=st.queue_R.at[jnp.where(out_M, st.queue_head - 1 - rank_M, R)].set(
          st.slot_request, mode="drop"),
      queue_head=st.queue_head - evicted, preemptions=st.preemptions + evicted,
      tokens_RN=st.tokens_RN.at[row_M].set(pad_id, mode="drop"),
      logprobs_RN=st.logprobs_RN.at[row_M].set(0.0, mode="drop"))
  if st.routing_RNLk is not None:
    st = st.replace(routing_RNLk=st.routing_RNLk.at[row_M].set(-1, mode="drop"))
  return empty_slots(st, out_M, prompt_pages, Q)
