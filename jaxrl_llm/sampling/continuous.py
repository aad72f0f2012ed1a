"""The continuous engine: M decode slots over a paged KV cache, a freed slot taking the next
request, all in one compiled program.

A call has R = P*G requests (request r = p*G + g is sample g of prompt p, the static
engine's row r). The program

  1. prefills the P prompts once (`decode.prefill`) and stores their keys and values as
     pages of a pool (`kv_cache`'s paged layout); a prompt's G requests name the same
     pages in their block tables, so its prefill is shared as in the static engine;
  2. loops until every request is done: empty slots take the next requests in order (their
     first token drawn from their prompt's logits), then one decode step runs every slot
     (one token each, at its own position), and a slot whose request ended (EOS or its
     budget, at most `max_new_tokens`) gives its pages back to the pool and is empty for the next step.

Pages are taken one at a time as a slot's sequence crosses a page boundary, from a free
stack, and returned when it ends, so the pool's pages in use follow the live tokens. By
default the pool holds every slot's worst case (each at `max_new_tokens`), so a step never
waits for memory. Attention reads the leading pages of every slot's block table, as many as
the longest live sequence needs rounded up to a power of two (`attention.paged_attention`);
slots are ordered by length each step and read in four groups, so a group of short
sequences does not read as far as the longest one. A step runs the smallest of
`paged.batch_sizes` that holds the live slots (`paged`, the step shared with the slot
engine).

A request draws its tokens from its own keys (`choose.request_keys`): its completion does
not depend on its slot, its neighbours or when it started, and equals the static engine's
for the same key. A step computes all M slots (fixed shapes); empty slots write to a page
nobody reads and record nothing.

Fewer pages (`SamplingSettings.kv_pages`, `page_pool`). With fewer own pages (at least one
completion's worst case) the engine schedules as vLLM's does, inside the loop: an empty
slot takes the next request only while free pages remain beside the running slots' next
pages and a reserve (1% of the pool, at least one page); a step whose growing slots
need more pages than are free first preempts the running requests admitted last, as few as
make room, by recompute: their pages are freed, their rows cleared, and they go back to the
front of the queue to start again from their prompts. Each draws from its own keys, so a
restarted request gets the same completion (tests/sampling/continuous_test.py). The oldest
running request is never preempted (the others' pages and the free ones make one
completion's worst case), so every call ends. stats: 'preemptions' beside 'peak_pages'.

Pallas kernels (not used). jax's TPU decode kernels, `ragged_paged_attention` (vLLM-TPU's:
pages [NP, Q, 2K (keys and values interleaved), Dh]) and `paged_attention` (pages
[K, NP, Q, Dh] for keys and for values), DMA a sequence's pages straight into VMEM. For the
Qwen3-1.7B recipe's per-chip shapes (32 slots x 28 pages of 32 tokens, 4 KV heads), one
layer's decode attention compiled by XLA:TPU for one v5e chip moves 204 MB with the gather
here (`aot.hlo_cost`; 292 MB with slot-minor pages) and 59 MB with either kernel (the
pages they DMA, plus queries and outputs): about 4.1 GB less per decode step of the 8.4 GB
`launch.compile` counts. At 128 slots that does
not make the engine beat the static one (modelled from those figures, 256 requests: every
completion at 512 tokens, 4.4 s vs 3.0; lengths uniform in [1, 512], 3.2 vs 2.9; a long
tail of median 180, 2.8 vs 3.0); with as many slots as requests, about 2.0-2.7 s. Using one
needs what this engine does not have: (1) a sequence's tokens contiguous from its first
page's first slot (the kernels take a length, no per-slot mask): prompts left-aligned, not
left-padded, and a prompt's last, partial page copied into each of its G requests' first
own page; (2) the step's new key and value in the pool before the kernel reads it (it
returns no log-sum-exp to add it after): a write inside each layer, so the layer scan must
carry the pool (a `transformer` change) and the pool flattened to [L * NP, ...] with page
ids offset by layer, as a layer's slice passed to a kernel is copied; (3) a `shard_map`
over the KV heads' tensor split; (4) a `cost_estimate` for `launch.compile`, which counts a
kernel without one as all its operands (the whole pool); block sizes passed explicitly,
and the default device set to the TPU, for a compile-only host.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jaxrl_llm import models
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import kv_cache
from jaxrl_llm.sampling import choose, decode, output, page_pool, paged
from jaxrl_llm.sampling.page_pool import EngineState
from jaxrl_llm.sampling.settings import SamplingSettings


def batch_shards(model: models.Model, prompts: int) -> tuple[tuple[str, ...], int]:
  """(mesh axes, count) of the data shards that each run their own engine on their share of
  the `prompts` (as a data-parallel group of inference servers does); ((), 1) runs one
  engine over the whole mesh: no mesh, prompts that do not split, or a model split over
  other mesh axes too (tensor parallel)."""
  if model.mesh is None:
    return (), 1
  spec = sh.logical_to_spec((sh.BATCH,), (prompts,), model.mesh, model.rules)[0]
  axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
  if not axes or any(n > 1 for a, n in model.mesh.shape.items() if a not in axes):
    return (), 1
  return axes, math.prod(model.mesh.shape[a] for a in axes)


def engine_slots(s: SamplingSettings, requests: int, shards: int = 1) -> int:
  """Decode slots of each of `shards` engines sharing `requests` completions: the settings'
  slots split over them (0: half of each engine's requests, the fastest of the counts
  measured on the long-tail workload: README, "Sampling engines")."""
  own = requests // shards
  return min(own, max(1, s.slots // shards)) if s.slots else max(1, own // 2)


def pool_pages(prompts: int, prompt_len: int, s: SamplingSettings, shards: int = 1) -> int:
  """Pages of the pool for `prompts` prompts of `prompt_len` slots (a multiple of the page
  size), over `shards` engines: each engine's prompts' pages, its `own_pages` for
  completions and one page nobody reads."""
  Q, own = s.page_size, prompts // shards
  slots = engine_slots(s, prompts * s.num_samples, shards)
  return shards * (own * (prompt_len // Q) + page_pool.own_pages(s, slots) + 1)


def _record(st: EngineState, live_M, token_M, logp_M, s: SamplingSettings):
  """Writes each live slot's chosen token at its request's next column."""
  R = st.lengths_R.shape[0]
  row_M = jnp.where(live_M, st.slot_request, R)  # out of range: dropped
  col_M = st.slot_chosen
  return st.replace(
      tokens_RN=st.tokens_RN.at[row_M, col_M].set(token_M, mode="drop"),
      logprobs_RN=st.logprobs_RN.at[row_M, col_M].set(logp_M, mode="drop"),
      slot_chosen=jnp.where(live_M, col_M + 1, col_M),
      slot_token=jnp.where(live_M, token_M, st.slot_token))


def _finish(st: EngineState, ended_M, eos_M, prompt_pages: int, Q: int):
  """Ends the requests of the slots `ended_M`: lengths recorded, pages freed, slots emptied."""
  R = st.lengths_R.shape[0]
  row_M = jnp.where(ended_M, st.slot_request, R)
  st = st.replace(lengths_R=st.lengths_R.at[row_M].set(st.slot_chosen, mode="drop"),
                  ended_R=st.ended_R.at[row_M].set(eos_M, mode="drop"))
  return page_pool.empty_slots(st, ended_M, prompt_pages, Q)


def continuous_program(model: models.Model, pool, tokens_PS, mask_PS, budget_R, key,
                       s: SamplingSettings):
  """Samples G completions of each of the P prompts; returns (SampleOutput, the pool, stats).

  `pool`: the page pool (`kv_cache.init_pages` with `pool_pages` pages, or one dict per
  layer when the layers run unrolled), donated. `tokens_PS`: prompts left-padded to a
  multiple of the page size. `budget_R`: each request's most new tokens (<= N). stats:
  {'steps': decode steps (the most of any engine), 'peak_pages': the most pages in use by
  completions at once, 'preemptions': running requests evicted for pages and started again
  (both summed over engines)}.

  On a data-parallel mesh (`batch_shards`) every data shard runs its own engine on its rows
  and its part of the pool, under `shard_map`; a request keeps its global index for its keys.
  """
  P = tokens_PS.shape[0]
  R = P * s.num_samples
  axes, shards = batch_shards(model, P)
  if shards == 1:
    return _engine(model, pool, tokens_PS, mask_PS, budget_R, choose.request_keys(key, R),
                   engine_slots(s, R), s)
  rows = jax.sharding.PartitionSpec(axes)
  pages = jax.tree.map(lambda x: jax.sharding.PartitionSpec(*((None,) * (x.ndim - 4)), axes),
                       pool)

  # Decided here, where the model's mesh says where it runs (the pool is laid out for it):
  # the local model below has none, and would get the tuning of the host's default devices.
  tune = decode.tuning(model)

  def one_shard(params, pool, tokens_PS, mask_PS, budget_R, key):
    local = model.replace(params=params, mesh=None, rules=None)
    first = jax.lax.axis_index(axes) * budget_R.shape[0]
    keys_R = choose.request_keys(key, budget_R.shape[0], first)
    out, pool, stats = _engine(local, pool, tokens_PS, mask_PS, budget_R, keys_R,
                               engine_slots(s, R, shards), s, tune)
    return out, pool, {"steps": jax.lax.pmax(stats["steps"], axes),
                       "peak_pages": jax.lax.psum(stats["peak_pages"], axes),
                       "preemptions": jax.lax.psum(stats["preemptions"], axes)}

  replicated = jax.sharding.PartitionSpec()
  return jax.shard_map(one_shard, mesh=model.mesh,
                       in_specs=(replicated, pages, rows, rows, rows, replicated),
                       out_specs=(rows, pages, replicated), check_vma=False)(
                           model.params, pool, tokens_PS, mask_PS, budget_R, key)


@dataclasses.dataclass(frozen=True)
class _Engine:
  """What an engine's admit and decode steps read and never change: the model, the
  settings, the sizes, the prompts' prefill and the requests' keys and budgets."""
  model: models.Model
  s: SamplingSettings
  tune: decode.DecodeTuning
  P: int  # prompts
  M: int  # slots
  SP: int  # pages of a prompt
  OWN: int  # most own pages of a slot
  pages: int  # own pages of the pool (`own_pages`)
  reserve: int  # free pages admission leaves to running slots (`admission_reserve`)
  spare: int  # the page that slots without a page of their own write to
  in_place: bool  # the TPU's layout: the layer scan reads the stacked pool in place
  logits_PV: jax.Array  # each prompt's last logits
  next_position_P: jax.Array
  mask_PS: jax.Array
  keys_R: jax.Array
  budget_R: jax.Array

  @property
  def R(self) -> int:  # requests
    return self.P * self.s.num_samples


def _engine(model: models.Model, pool, tokens_PS, mask_PS, budget_R, keys_R, M: int,
            s: SamplingSettings, tune: decode.DecodeTuning | None = None):
  """One engine of M slots over `pool` for the P prompts' R = P*G requests (keys `keys_R`;
  `tune`: the decode tuning, default `model`'s)."""
  P, S0 = tokens_PS.shape
  N, Q = s.max_new_tokens, s.page_size
  R = P * s.num_samples
  SP, OWN = S0 // Q, -(-N // Q)  # pages of a prompt, most own pages of a slot
  unrolled = isinstance(pool, tuple)
  model, own_tune = decode.decode_model(model, s, unrolled)
  tune = tune or own_tune

  moe = model.config.is_moe  # routing replay's record, as the static engine's
  prompt_cache, logits_PV, positions_PS, *prompt_routing = decode.prefill(
      model, tokens_PS, mask_PS, tune, unrolled, with_router=moe)
  pool = kv_cache.put_pages(pool, kv_cache.as_pages(prompt_cache, Q))  # prompt p: pages p*SP...
  pages = page_pool.own_pages(s, M)
  first_own, spare = P * SP, P * SP + pages  # own pages [first_own, spare), one spare page
  reserve = page_pool.admission_reserve(pages, M, s)
  e = _Engine(model, s, tune, P, M, SP, OWN, pages, reserve, spare,
              in_place=not unrolled and tune.key_layout == "slot_major",
              logits_PV=logits_PV, next_position_P=positions_PS[:, -1] + 1, mask_PS=mask_PS,
              keys_R=keys_R, budget_R=budget_R)

  def step(st: EngineState) -> EngineState:
    waiting = jnp.any(st.slot_request < 0) & (st.queue_head < R)
    st = jax.lax.cond(waiting, functools.partial(_admit, e), lambda st: st, st)
    return _decode_step(e, st)

  def running(st: EngineState):
    return (st.queue_head < R) | jnp.any(st.slot_request >= 0)

  st = EngineState(
      slot_request=jnp.full((M,), -1, jnp.int32), slot_chosen=jnp.zeros((M,), jnp.int32),
      slot_token=jnp.zeros((M,), jnp.int32), slot_admitted=jnp.zeros((M,), jnp.int32),
      block_table=jnp.full((M, SP + OWN), spare, jnp.int32),
      free_pages=jnp.arange(first_own, spare, dtype=jnp.int32), free_count=jnp.int32(pages),
      queue_R=jnp.arange(R, dtype=jnp.int32), queue_head=jnp.int32(0),
      admissions=jnp.int32(0), tokens_RN=jnp.full((R, N), s.pad_id, jnp.int32),
      logprobs_RN=jnp.zeros((R, N), jnp.float32), lengths_R=jnp.zeros((R,), jnp.int32),
      ended_R=jnp.zeros((R,), bool), pool=pool, steps=jnp.int32(0), peak_pages=jnp.int32(0),
      preemptions=jnp.int32(0),
      routing_RNLk=decode.empty_record(model.config, R, N) if moe else None)
  st = jax.lax.while_loop(running, step, st)
  out = output.from_lengths(st.tokens_RN, st.logprobs_RN, st.lengths_R, st.ended_R)
  if moe:  # [R, S0 + N, ...]: each prompt's, then each request's completion tokens fed back
    out = out.replace(routing=decode.sample_routing(prompt_routing[0], st.routing_RNLk,
                                                    s.num_samples))
  return out, st.pool, {"steps": st.steps, "peak_pages": st.peak_pages,
                        "preemptions": st.preemptions}


def _admit(e: _Engine, st: EngineState) -> EngineState:
  """Empty slots take the next requests, as many as the free pages allow beside the running
  slots' next pages and the reserve, and choose their first token."""
  G, R, M, SP, OWN = e.s.num_samples, e.R, e.M, e.SP, e.OWN
  empty_M = st.slot_request < 0
  running = jnp.any(~empty_M)  # with none running, the pool holds a request's worst case
  room = (st.free_count - jnp.sum(page_pool.opens_page(st, e.s.page_size), dtype=jnp.int32)
          - jnp.where(running, e.reserve, 0))
  place_M = st.queue_head + jnp.cumsum(empty_M) - 1
  new_M = empty_M & (place_M < R) & (jnp.cumsum(empty_M) <= room)
  request_M = jnp.where(new_M, st.queue_R[jnp.clip(place_M, 0, R - 1)], st.slot_request)
  prompt_M = jnp.clip(request_M // G, 0, e.P - 1)
  table_MP = jnp.where(new_M[:, None], jnp.concatenate(
      [prompt_M[:, None] * SP + jnp.arange(SP)[None], jnp.full((M, OWN), e.spare)], axis=1),
                       st.block_table)
  admitted = jnp.sum(new_M, dtype=jnp.int32)
  st = st.replace(slot_request=request_M, block_table=table_MP,
                  slot_chosen=jnp.where(new_M, 0, st.slot_chosen),
                  slot_admitted=jnp.where(new_M, st.admissions + jnp.cumsum(new_M) - 1,
                                          st.slot_admitted),
                  queue_head=st.queue_head + admitted, admissions=st.admissions + admitted)
  token_M, logp_M = choose.choose_tokens(
      e.logits_PV[prompt_M], choose.token_keys(e.keys_R[jnp.clip(request_M, 0, R - 1)], 0), e.s)
  st = _record(st, new_M, token_M, logp_M, e.s)
  eos_M = choose.is_eos(token_M, e.s)
  budget_M = e.budget_R[jnp.clip(request_M, 0, R - 1)]
  return _finish(st, new_M & (eos_M | (budget_M == 1)), eos_M, SP, e.s.page_size)


def _decode_step(e: _Engine, st: EngineState) -> EngineState:
  """Feeds every live slot's last token and chooses its next one."""
  M, SP, Q = e.M, e.SP, e.s.page_size
  short = jnp.sum(page_pool.opens_page(st, Q), dtype=jnp.int32) > st.free_count
  preempt = functools.partial(page_pool.preempt, prompt_pages=SP, Q=Q, pad_id=e.s.pad_id)
  st = jax.lax.cond(short, preempt, lambda st: st, st)
  live_M = st.slot_request >= 0
  request_M = jnp.clip(st.slot_request, 0, e.R - 1)
  prompt_M = request_M // e.s.num_samples
  w_M = jnp.maximum(st.slot_chosen - 1, 0)  # own slot of the fed token
  page_col_M = SP + w_M // Q
  # A slot whose token opens a page takes one from the top of the free stack.
  opens_M = live_M & (w_M % Q == 0)
  top_M = st.free_count - jnp.cumsum(opens_M)
  taken_M = st.free_pages[jnp.clip(top_M, 0, st.free_pages.shape[0] - 1)]
  rows_M = jnp.arange(M)
  table_MP = st.block_table.at[rows_M, page_col_M].set(
      jnp.where(opens_M, taken_M, st.block_table[rows_M, page_col_M]))
  free_count = st.free_count - jnp.sum(opens_M, dtype=jnp.int32)
  write_page_M = jnp.where(live_M, table_MP[rows_M, page_col_M], e.spare)
  own_valid_MO = jnp.arange(e.OWN * Q)[None] < jnp.where(live_M, w_M, 0)[:, None]
  valid_MS = jnp.concatenate([e.mask_PS[prompt_M], own_valid_MO.astype(jnp.int32)], axis=1)
  positions_M = e.next_position_P[prompt_M] + w_M
  keys_M = choose.token_keys(e.keys_R[request_M], st.slot_chosen)
  moe = st.routing_RNLk is not None
  (token_M, logp_M), (k_new, v_new), experts_MLk = paged.decode_slots(
      e.model, e.tune, st.pool, tokens_M=st.slot_token, positions_M=positions_M,
      valid_MS=valid_MS, live_M=live_M, pages_M=jnp.where(live_M, w_M // Q + 1, 0),
      table_MP=table_MP, prompt_pages=SP, in_place=e.in_place, moe=moe,
      choose=lambda logits_bV, at_b: choose.choose_tokens(logits_bV, keys_M[at_b], e.s))
  if moe:  # the fed token's experts, at its completion column
    row_M = jnp.where(live_M & (st.slot_chosen > 0), request_M, e.R)  # out of range: dropped
    st = st.replace(routing_RNLk=st.routing_RNLk.at[row_M, w_M].set(
        experts_MLk.astype(jnp.int32), mode="drop"))
  pool = kv_cache.write_pages(st.pool, k_new, v_new, write_page_M, w_M % Q)
  st = st.replace(block_table=table_MP, free_count=free_count, pool=pool, steps=st.steps + 1,
                  peak_pages=jnp.maximum(st.peak_pages, e.pages - free_count))
  st = _record(st, live_M, token_M, logp_M, e.s)
  eos_M = choose.is_eos(token_M, e.s)
  return _finish(st, live_M & (eos_M | (st.slot_chosen == e.budget_R[request_M])), eos_M, SP, Q)
