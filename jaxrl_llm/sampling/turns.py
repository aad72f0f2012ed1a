"""Multi-turn sampling: the model's turns in B episodes over one KV cache kept between turns.

Each `TurnSampler.turn` call appends to every episode the tokens that arrived since its
last turn (the whole prompt on the first call, then what the environment added: the chat
template's suffix for its messages, `jaxrl_llm.envs.ChatRenderer.suffix_ids`) and samples
the model's next turn, until the end-of-turn token (`SamplingSettings.eos_ids`) or the
turn's budget. The keys and values of everything earlier are read from the cache: only
the new tokens are prefilled, once.

Layout. All rows write the same cache columns: a call's new tokens are left-padded to the
longest of the call (one chunk of C columns), then every decode step writes one column. A
row's mask marks the columns that hold its tokens and its positions count its own tokens,
as left padding does in the static engine, so a row's numbers do not depend on its
neighbours. The cache has `max_columns` columns for the whole episode; the cache, the mask
and the positions stay on the device between calls (the cache donated).

Keys. Episode b draws its j-th model token (counted over all its turns) from
fold_in(fold_in(key, b), j), the static engine's rule for request b: a turn's tokens do
not depend on the batch or on how an episode's tokens are split into turns.

An episode that has ended takes no new tokens and a budget of 0: it samples nothing.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm import models
from jaxrl_llm.models import kv_cache
from jaxrl_llm.sampling import choose, decode
from jaxrl_llm.sampling.sampler import bucket_length, left_pad
from jaxrl_llm.sampling.settings import SamplingSettings


@struct.dataclass
class TurnState:
  """What the episodes keep on the device between turns.

  Attributes:
    cache: the rows' keys and values, `max_columns` slots (stacked, or one dict per layer).
    kv_mask_BW: int32 [B, W], 1 on the columns that hold each row's tokens.
    next_position_B: int32 [B], the position of each row's next token.
    drawn_B: int32 [B], model tokens each row has drawn so far (its key counter).
    routing_BWLk: an MoE model's experts int32 [B, W, MoE layers, k] of the token each
      column holds, once fed (-1: none; routing replay's record), else None.
  """
  cache: tuple | dict
  kv_mask_BW: jax.Array
  next_position_B: jax.Array
  drawn_B: jax.Array
  routing_BWLk: jax.Array | None = None


@struct.dataclass
class TurnOutput:
  """One turn of every row: tokens int32 [B, N] (pad after the end), behaviour log-probs
  float32 [B, N] (0 after the end), lengths int32 [B] (the end-of-turn token included),
  ended bool [B] (by an end-of-turn token; else its budget, or nothing to sample)."""
  tokens: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  ended: jax.Array


def _turn_program(model: models.Model, st: TurnState, column, chunk_BC, chunk_mask_BC,
                  budget_B, keys_B, s: SamplingSettings):
  """Prefills each row's new tokens at columns [column, column + C), then decodes its turn
  from column + C on; returns (TurnOutput, TurnState, decode steps)."""
  B, C = chunk_BC.shape
  N = s.max_new_tokens
  model, tune = decode.decode_model(model, s, isinstance(st.cache, tuple))
  kv_mask_BW = jax.lax.dynamic_update_slice(st.kv_mask_BW, chunk_mask_BC, (0, column))
  positions_BC = jnp.where(chunk_mask_BC > 0, st.next_position_B[:, None]
                           + jnp.cumsum(chunk_mask_BC, axis=1) - 1, 0)
  moe = st.routing_BWLk is not None
  hidden_BCD, cache, *routed = decode.forward(model, chunk_BC, positions_BC, kv_mask_BW,
                                              st.cache, column, tune=tune, return_hidden=True,
                                              with_router=moe)
  routing = _record_experts(st.routing_BWLk, routed, chunk_mask_BC > 0, column)
  logits_BV = models.unembed(model, hidden_BCD[:, -1:])[:, 0]  # after each row's last token
  next_position_B = st.next_position_B + jnp.sum(chunk_mask_BC, axis=1)
  start = column + C

  def draw(logits_BV, drawn_B, lengths_B, done_B):
    token_B, logp_B = choose.choose_tokens(logits_BV, choose.token_keys(keys_B, drawn_B), s)
    live_B = ~done_B & (lengths_B < budget_B)
    return token_B, logp_B, live_B

  def record(carry, token_B, logp_B, live_B):
    t, tokens_BN, logprobs_BN, lengths_B, done_B, drawn_B, ended_B = carry
    col = jnp.where(live_B, token_B, s.pad_id)
    tokens_BN = jax.lax.dynamic_update_slice(tokens_BN, col[:, None], (0, t))
    logprobs_BN = jax.lax.dynamic_update_slice(
        logprobs_BN, jnp.where(live_B, logp_B, 0.0)[:, None], (0, t))
    eos_B = live_B & choose.is_eos(token_B, s)
    lengths_B = lengths_B + live_B.astype(jnp.int32)
    drawn_B = drawn_B + live_B.astype(jnp.int32)
    done_B = done_B | eos_B | (lengths_B >= budget_B)
    return (t + 1, tokens_BN, logprobs_BN, lengths_B, done_B, drawn_B, ended_B | eos_B), token_B

  zeros_B = jnp.zeros((B,), jnp.int32)
  carry = (jnp.int32(0), jnp.full((B, N), s.pad_id, jnp.int32), jnp.zeros((B, N), jnp.float32),
           zeros_B, budget_B <= 0, st.drawn_B, jnp.zeros((B,), bool))
  carry, token_B = record(carry, *draw(logits_BV, st.drawn_B, zeros_B, carry[4]))

  def cond(state):
    (t, _, _, _, done_B, _, _), *_ = state
    return (t < N) & ~jnp.all(done_B)

  def step(state):  # feeds the token of column t - 1, chooses the token of column t
    carry, token_B, kv_mask_BW, cache, routing = state
    t, _, _, lengths_B, done_B, drawn_B, _ = carry
    slot = start + t - 1
    fed_B = ~done_B  # a row that just ended does not feed its last token
    kv_mask_BW = jax.lax.dynamic_update_slice(kv_mask_BW, fed_B.astype(jnp.int32)[:, None],
                                              (0, slot))
    positions_B1 = (next_position_B + lengths_B - 1)[:, None]
    logits_B1V, cache, *routed = decode.forward(model, token_B[:, None], positions_B1,
                                                kv_mask_BW, cache, slot, tune=tune,
                                                with_router=moe)
    routing = _record_experts(routing, routed, fed_B[:, None], slot)
    carry, token_B = record(carry, *draw(logits_B1V[:, 0], drawn_B, lengths_B, done_B))
    return carry, token_B, kv_mask_BW, cache, routing

  carry, token_B, kv_mask_BW, cache, routing = jax.lax.while_loop(
      cond, step, (carry, token_B, kv_mask_BW, cache, routing))
  t, tokens_BN, logprobs_BN, lengths_B, _, drawn_B, ended_B = carry
  # The last token of each turn is not fed yet: the next call's chunk starts with it.
  out = TurnOutput(tokens=tokens_BN, logprobs=logprobs_BN, lengths=lengths_B, ended=ended_B)
  state = TurnState(cache=kv_cache.own_part(cache), kv_mask_BW=kv_mask_BW,
                    next_position_B=next_position_B + jnp.maximum(lengths_B - 1, 0),
                    drawn_B=drawn_B, routing_BWLk=routing)
  return out, state, t - 1


def _record_experts(routing_BWLk, routed, fed_BC, column):
  """`routing_BWLk` with the experts of the C tokens fed at `column` written there (-1 where
  a row fed nothing); unchanged without a record."""
  if routing_BWLk is None:
    return None
  return decode.record_experts(routing_BWLk, routed[0]["experts"], fed_BC, (0, column, 0, 0))


class TurnSampler:
  """Samples the turns of B episodes; keeps their cache between calls.

  Args:
    settings: the sampler's settings; `eos_ids` are the end-of-turn tokens and
      `max_new_tokens` the most tokens of one turn (`num_samples` is not read: the caller
      gives one row per episode).
    max_columns: cache columns for a whole episode (each call uses its chunk's width, a
      bucket of its longest new part, plus the turn's decode steps). Each decode step
      reads every column, so a tight size decodes faster.
    grow_to: if larger than `max_columns`, the cache grows (its columns doubled, at most
      to `grow_to`; each size compiles once) when a call needs more; else a call that
      needs more raises.
    buckets: the chunk widths a call may use (a chunk is left-padded to the smallest that
      fits; each width compiles once).
  """

  def __init__(self, settings: SamplingSettings, max_columns: int,
               buckets: Sequence[int] = (8, 16, 32, 64, 128, 256, 512, 1024),
               grow_to: int = 0):
    self.settings, self.initial_columns = settings, max_columns
    self.max_columns, self.grow_to = max_columns, max(grow_to, max_columns)
    self.buckets = tuple(sorted(buckets))
    self._program = jax.jit(lambda model, st, column, chunk, mask, budget, keys: _turn_program(
        model, st, column, chunk, mask, budget, keys, settings), donate_argnums=(1,),
                            compiler_options=models.COMPILER_OPTIONS)
    self.state, self.column, self.keys_B = None, 0, None

  def start(self, model: models.Model, rows: int, key: jax.Array,
            numbers: Sequence[int] | None = None) -> None:
    """Empties the cache for `rows` new episodes whose keys fold from `key`: episode b's
    by b, or by `numbers[b]` (its row in a batch spanning processes)."""
    if model.mesh is not None:
      raise ValueError("TurnSampler runs one device's episodes; place the model without a mesh")
    cfg = model.config
    unrolled = decode.unrolls_layers(self.settings, model)
    self.max_columns = self.initial_columns
    cache = kv_cache.init_cache(cfg, rows, self.max_columns, cfg.jnp_dtype,
                                decode.tuning(model).key_layout)
    if unrolled:
      cache = decode.per_layer(cache)
    routing = decode.empty_record(cfg, rows, self.max_columns) if cfg.is_moe else None
    self.state = TurnState(cache=cache, kv_mask_BW=jnp.zeros((rows, self.max_columns), jnp.int32),
                           next_position_B=jnp.zeros((rows,), jnp.int32),
                           drawn_B=jnp.zeros((rows,), jnp.int32), routing_BWLk=routing)
    self.column = 0
    self.keys_B = choose.numbered_keys(key, range(rows) if numbers is None else numbers)

  def turn(self, model: models.Model, new_tokens: Sequence[Sequence[int]],
           budgets: Sequence[int]) -> TurnOutput:
    """Appends each row's `new_tokens` (after its previous turn's last token, which is fed
    first) and samples its next turn of at most `budgets[b]` tokens (0: the row sits this
    turn out; its new tokens must be empty). Returns the turn as numpy arrays."""
    if self.state is None:
      raise ValueError("call start(model, rows, key) before turn()")
    rows = self.state.drawn_B.shape[0]
    if len(new_tokens) != rows or len(budgets) != rows:
      raise ValueError(f"expected {rows} rows of new tokens and budgets, got {len(new_tokens)} "
                       f"and {len(budgets)}")
    N = self.settings.max_new_tokens
    budget = np.asarray(budgets, np.int32)
    if budget.min() < 0 or budget.max() > N:
      raise ValueError(f"budgets: expected each in [0, {N}] (max_new_tokens), got "
                       f"[{budget.min()}, {budget.max()}]")
    if any(b > 0 and not len(t) for t, b in zip(new_tokens, budget)):
      raise ValueError("a row with a budget needs at least one new token (the prompt, or its "
                       "previous turn's last token and the environment's reply)")
    width = bucket_length(max(1, max(len(t) for t in new_tokens)), self.buckets)
    needed = self.column + width + N
    if self.max_columns < needed <= self.grow_to:
      self._grow(min(self.grow_to, max(needed, 2 * self.max_columns)))
    if needed > self.max_columns:
      raise ValueError(f"the episodes need {self.column + width + N} cache columns, more than "
                       f"max_columns={self.max_columns}: expected a larger max_columns (or "
                       "shorter episodes)")
    chunk, mask = left_pad(new_tokens, width, self.settings.pad_id)
    out, self.state, steps = self._program(model, self.state, jnp.int32(self.column), chunk, mask,
                                           budget, self.keys_B)
    self.column += width + int(steps)
    return jax.device_get(out)

  def lower_shapes(self, model: models.Model, rows: int, new_tokens: int, columns: int,
                   place=lambda x: x):
    """The turn program for `rows` episodes appending up to `new_tokens` tokens each (a
    chunk of their bucket, at most the largest) into a cache of `columns`, lowered from
    shapes alone: `model` may hold `jax.ShapeDtypeStruct`s, and `place` puts each argument's
    struct where it lives (one device of a TPU slice this host does not have:
    `launch.compile`)."""
    cfg = model.config
    ints = lambda *shape: place(jax.ShapeDtypeStruct(shape, jnp.int32))
    width = bucket_length(min(new_tokens, max(self.buckets)), self.buckets)
    cache = jax.tree.map(place, jax.eval_shape(lambda: kv_cache.init_cache(
        cfg, rows, columns, key_layout=decode.tuning(model).key_layout)))
    state = TurnState(cache=cache, kv_mask_BW=ints(rows, columns), next_position_B=ints(rows),
                      drawn_B=ints(rows))
    keys = place(jax.eval_shape(lambda: choose.request_keys(jax.random.key(0), rows)))
    return self._program.lower(model, state, ints(), ints(rows, width), ints(rows, width),
                               ints(rows), keys)

  def _grow(self, columns: int) -> None:
    """More cache columns, zeros after the used ones."""
    extra = columns - self.max_columns
    grow = lambda c: kv_cache.pad_slots(c, extra)
    cache = self.state.cache
    cache = tuple(grow(c) for c in cache) if isinstance(cache, tuple) else grow(cache)
    routing = self.state.routing_BWLk
    if routing is not None:
      routing = jnp.pad(routing, ((0, 0), (0, extra), (0, 0), (0, 0)), constant_values=-1)
    self.state = self.state.replace(
        cache=cache, kv_mask_BW=jnp.pad(self.state.kv_mask_BW, ((0, 0), (0, extra))),
        routing_BWLk=routing)
    self.max_columns = columns

  def routing(self) -> list[np.ndarray] | None:
    """An MoE model's record: each row's experts int32 [tokens fed, MoE layers, k], its
    tokens in order (the prompt, its turns but the last token, the environment's replies);
    None for a dense model."""
    if self.state is None or self.state.routing_BWLk is None:
      return None
    routing, mask = jax.device_get((self.state.routing_BWLk, self.state.kv_mask_BW))
    return [r[m > 0] for r, m in zip(routing, mask)]
