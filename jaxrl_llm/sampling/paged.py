"""One decode step over a paged KV cache, shared by the engines that decode slots: the
continuous engine (`continuous`) and the slot engine (`serving.slots`).

Each step feeds every live slot's last token at its own position. Live slots go first,
longest first: the step runs the smallest of `batch_sizes` that holds them, and reads them
in `groups`, each about as far as its own longest sequence (`read_sizes` pages, rounded up),
so a group of short sequences does not read as far as the longest one. The slots' new keys
and values come back in slot order, for the caller to write to its pages (empty slots' to a
page nobody reads), with, for a mixture of experts, the experts of each fed token.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrl_llm.models import kv_cache
from jaxrl_llm.sampling import decode


def read_sizes(own_pages: int) -> tuple[int, ...]:
  """The numbers of own pages an attention read may cover: powers of two, then all."""
  sizes, n = [], 1
  while n < own_pages:
    sizes.append(n)
    n *= 2
  return tuple(sizes) + (own_pages,)


def batch_sizes(slots: int) -> tuple[int, ...]:
  """The batch sizes a decode step may run: all slots, a quarter, a sixteenth (the smallest
  that holds the live slots runs, so the end of a call, when few requests are left, costs
  less)."""
  return tuple(sorted({max(1, slots // 16), max(1, slots // 4), slots}))


def groups(batch: int, most: int = 4) -> tuple[tuple[int, int], ...]:
  """`batch` slots cut into at most `most` contiguous groups of near-equal size."""
  n = min(most, batch)
  bounds = [batch * i // n for i in range(n + 1)]
  return tuple(zip(bounds[:-1], bounds[1:]))


def decode_slots(model, tune, pool, *, tokens_M, positions_M, valid_MS, live_M, pages_M,
                 table_MP, prompt_pages: int, in_place: bool, moe: bool,
                 choose: Callable):
  """One decode step of the live slots of `pool` (module docstring).

  Args:
    model, tune: the decode model and its platform's tuning (`decode.decode_model`).
    pool: the KV page pool (per layer, or stacked).
    tokens_M, positions_M: each slot's fed token and its position.
    valid_MS: each slot's attention mask over the columns its block table names.
    live_M: the slots that decode; pages_M: each one's own pages so far (0 when empty).
    table_MP: each slot's block table.
    prompt_pages: the pages every read covers before a slot's own (a shared prompt's).
    in_place: attention reads the pool where it lies (`kv_cache.PagedIndex.pool`).
    moe: also return the experts each fed token was routed to.
    choose: (logits [b, V], the b slots' indices) -> what the step returns per slot, for
      the b slots that ran (e.g. their tokens and log-probs, or the logits themselves).

  Returns:
    (`choose`'s outputs in slot order, zeros for the slots that did not run; the new (keys,
    values) in slot order; the experts [M, L, k] or None).
  """
  M = live_M.shape[0]
  order_M = jnp.argsort(-pages_M, stable=True)
  sizes = read_sizes(table_MP.shape[1] - prompt_pages)

  def run(b: int):
    def batch(pool):
      at_b = order_M[:b]
      cut = groups(b)
      longest_g = jnp.maximum(pages_M[at_b][jnp.asarray([lo for lo, _ in cut])], 1)
      index = kv_cache.PagedIndex(
          block_table=table_MP[at_b],
          read_branch=jnp.searchsorted(jnp.asarray(sizes), longest_g).astype(jnp.int32),
          read_pages=tuple(prompt_pages + n for n in sizes), groups=cut,
          pool=pool if in_place else None)
      cache = kv_cache.pool_layers(model.config.num_layers) if in_place else pool
      logits_b1V, cache, *routed = decode.forward(
          model, tokens_M[at_b][:, None], positions_M[at_b][:, None], valid_MS[at_b], cache,
          index, tune=tune, with_router=moe)
      chosen = choose(logits_b1V[:, 0], at_b)
      # Back in slot order, for all M slots (the others write to the spare page).
      in_slots = lambda x, axis: jnp.zeros(x.shape[:axis] + (M,) + x.shape[axis + 1:],
                                           x.dtype).at[(slice(None),) * axis + (at_b,)].set(x)
      new_kv = jax.tree.map(lambda x: in_slots(x, x.ndim - 4), kv_cache.pending(cache))
      experts = in_slots(routed[0]["experts"][:, 0], 0) if moe else None
      return jax.tree.map(lambda x: in_slots(x, 0), chosen), new_kv, experts
    return batch

  sizes_b = batch_sizes(M)
  live = jnp.sum(live_M, dtype=jnp.int32)
  return jax.lax.switch(jnp.searchsorted(jnp.asarray(sizes_b), live),
                        [run(b) for b in sizes_b], pool)
