"""The sampling program and the `Sampler` that keeps it compiled (see the package docstring)."""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm import distributed, models
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import kv_cache
from jaxrl_llm.sampling import choose, decode
from jaxrl_llm.sampling.settings import SamplingSettings

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@struct.dataclass
class SampleOutput:
  """Completions of B = P*G rows, prompt-major (the G samples of prompt 0 come first).

  Attributes:
    tokens: int32 [B, N], `pad_id` after the end.
    mask: int32 [B, N], 1 on generated tokens up to and including EOS.
    logprobs: float32 [B, N], behaviour log-probs (0 where mask is 0).
    lengths: int32 [B], number of generated tokens (EOS included).
    truncated: bool [B], True when N tokens were generated without an EOS.
  """
  tokens: jax.Array
  mask: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  truncated: jax.Array


def bucket_length(length: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= length (past the largest: the next multiple of it)."""
  for b in sorted(buckets):
    if length <= b:
      return b
  top = max(buckets)
  return -(-length // top) * top


def left_pad(prompts: Sequence[Sequence[int]], length: int, pad_id: int):
  """Token lists -> (tokens, mask) int32 [P, length], right-aligned."""
  tokens = np.full((len(prompts), length), pad_id, np.int32)
  mask = np.zeros((len(prompts), length), np.int32)
  for i, p in enumerate(prompts):
    if len(p):
      tokens[i, length - len(p):] = p
      mask[i, length - len(p):] = 1
  return tokens, mask


# --- the program --------------------------------------------------------------------------------
@struct.dataclass
class _LoopState:
  t: jax.Array             # next column to fill
  token_B: jax.Array       # token chosen for column t - 1
  done_B: jax.Array        # finished before column t
  tokens_BN: jax.Array
  logprobs_BN: jax.Array
  lengths_B: jax.Array
  kv_mask_BS: jax.Array
  cache: tuple


def _record(st: _LoopState, token_B, logp_B, s: SamplingSettings) -> _LoopState:
  """Writes column t (for rows still running) and advances t."""
  live_B = ~st.done_B
  col = jnp.where(live_B, token_B, s.pad_id)
  tokens_BN = jax.lax.dynamic_update_slice(st.tokens_BN, col[:, None], (0, st.t))
  logprobs_BN = jax.lax.dynamic_update_slice(
      st.logprobs_BN, jnp.where(live_B, logp_B, 0.0)[:, None], (0, st.t))
  is_eos_B = jnp.isin(token_B, jnp.asarray(s.eos_ids, jnp.int32)) if s.eos_ids else jnp.zeros_like(live_B)
  return st.replace(t=st.t + 1, token_B=token_B, done_B=st.done_B | is_eos_B,
                    tokens_BN=tokens_BN, logprobs_BN=logprobs_BN,
                    lengths_B=st.lengths_B + live_B.astype(jnp.int32))


def _sample_program(model: models.Model, cache, tokens_PS, mask_PS, key, s: SamplingSettings):
  P, S0 = tokens_PS.shape
  G, N = s.num_samples, s.max_new_tokens
  B = P * G
  S = S0 + N

  # Once per call, not once per token: the weights in the compute dtype, in the decode layout
  # (`SamplingSettings.weight_layout`: no all-gather inside the loop), unstacked if unrolled.
  dt = model.config.jnp_dtype
  unrolled = isinstance(cache, tuple)
  params = jax.tree.map(lambda p: p.astype(dt) if jnp.issubdtype(p.dtype, jnp.floating) else p,
                        model.params)
  decode_shardings = decode.decode_weight_shardings(model, s.weight_layout)
  if decode_shardings is not None:
    params = jax.lax.with_sharding_constraint(params, decode_shardings)
  model = model.replace(params=params)
  tune = decode.tuning(model)
  if unrolled:
    model = decode.unstack_layers(model)

  # Prefill: each prompt once, into a cache its G samples then share as their prefix.
  positions_PS = models.positions_from_mask(mask_PS)
  prompt_cache = kv_cache.init_cache(model.config, P, S0, dt)
  if unrolled:
    prompt_cache = decode.per_layer(prompt_cache)
  hidden_PSD, prompt_cache = decode.forward(model, tokens_PS, positions_PS, mask_PS, prompt_cache,
                                            0, tune=tune, return_hidden=True)
  logits_PV = models.unembed(model, hidden_PSD[:, -1:])[:, 0]  # only the last prompt token's
  if model.mesh is not None:
    cache = jax.lax.with_sharding_constraint(cache, _cache_shardings(model, B, N, unrolled))
  cache = kv_cache.with_shared_prefix(prompt_cache, cache)
  kv_mask_BS = jnp.zeros((B, S), jnp.int32).at[:, :S0].set(jnp.repeat(mask_PS, G, axis=0))
  next_position_B = jnp.repeat(positions_PS[:, -1] + 1, G)

  # Column t's noise comes from fold_in(key, t): threefry counts per entry, so XLA fuses the
  # draw into the token choice, and rows split over devices draw only their own entries.
  token_B, logp_B = choose.choose_tokens(jnp.repeat(logits_PV, G, axis=0), jax.random.fold_in(key, 0), s)
  st = _LoopState(t=jnp.int32(0), token_B=token_B, done_B=jnp.zeros((B,), bool),
                  tokens_BN=jnp.full((B, N), s.pad_id, jnp.int32),
                  logprobs_BN=jnp.zeros((B, N), jnp.float32), lengths_B=jnp.zeros((B,), jnp.int32),
                  kv_mask_BS=kv_mask_BS, cache=cache)
  st = _record(st, token_B, logp_B, s)

  def cond(st):
    return (st.t < N) & ~jnp.all(st.done_B)

  def step(st):  # feed the token of column t - 1, choose the token of column t
    slot = S0 + st.t - 1
    kv_mask_BS = jax.lax.dynamic_update_slice(st.kv_mask_BS, jnp.ones((B, 1), jnp.int32), (0, slot))
    positions_B1 = (next_position_B + st.t - 1)[:, None]
    logits_B1V, cache = decode.forward(model, st.token_B[:, None], positions_B1, kv_mask_BS,
                                       st.cache, slot, tune=tune)
    token_B, logp_B = choose.choose_tokens(logits_B1V[:, 0], jax.random.fold_in(key, st.t), s)
    return _record(st.replace(kv_mask_BS=kv_mask_BS, cache=cache), token_B, logp_B, s)

  st = jax.lax.while_loop(cond, step, st)
  mask_BN = (jnp.arange(N)[None, :] < st.lengths_B[:, None]).astype(jnp.int32)
  out = SampleOutput(tokens=st.tokens_BN, mask=mask_BN, logprobs=st.logprobs_BN,
                     lengths=st.lengths_B, truncated=(st.lengths_B == N) & ~st.done_B)
  return out, kv_cache.own_part(st.cache)


class Sampler:
  """Compiled sampling for one model config and settings; keeps the donated cache buffer."""

  def __init__(self, settings: SamplingSettings, buckets: Sequence[int] = DEFAULT_BUCKETS):
    self.settings = settings
    self.buckets = tuple(sorted(buckets))
    self._program = jax.jit(functools.partial(_sample_program, s=settings), donate_argnums=(1,),
                            compiler_options=models.COMPILER_OPTIONS)
    self._cache = None

  def num_compilations(self) -> int:
    return self._program._cache_size()

  @property
  def cache(self):
    """The rows' KV buffers kept for the next call (None before the first call or after
    `free`): B x (max_new_tokens) slots per layer, sharded over the batch and KV heads."""
    return self._cache

  def free(self) -> None:
    """Drops the kept KV buffers (the next call allocates them again)."""
    self._cache = None

  def __call__(self, model: models.Model, prompts: Sequence[Sequence[int]], seed) -> SampleOutput:
    """Samples the prompts; returns global arrays (rows prompt-major).

    With several processes, `prompts` are this process's prompts: the batch is every
    process's prompts in process order, all padded to one bucket, and `model` must be
    on a mesh. `sample_local` returns just this process's rows on the host.
    """
    out, self._cache = self._program(*self._arguments(model, prompts, seed))
    return out

  def lower(self, model: models.Model, prompts: Sequence[Sequence[int]], seed=0):
    """The sampling program for these arguments, lowered (`.compile().as_text()` shows it)."""
    return self._program.lower(*self._arguments(model, prompts, seed))

  def _arguments(self, model, prompts, seed):
    """Checks the prompts; returns the program's (model, cache, tokens, mask, key)."""
    if not len(prompts):
      raise ValueError("prompts is empty: expected a list of token-id lists")
    if min(len(p) for p in prompts) == 0:
      raise ValueError("a prompt is empty: every prompt needs at least one token")
    multi = jax.process_count() > 1
    if multi and model.mesh is None:
      raise ValueError("with several processes the model must be placed on a mesh "
                       "(models.from_pretrained/init with mesh=...)")
    s = self.settings
    # Every process pads to the same bucket: the longest prompt of any process decides.
    longest = distributed.max_int(max(len(p) for p in prompts))
    tokens, mask = left_pad(prompts, bucket_length(longest, self.buckets), s.pad_id)
    if tokens.max() >= model.config.vocab_size or tokens.min() < 0:
      raise ValueError(f"prompt token ids must lie in [0, {model.config.vocab_size}); got "
                       f"[{tokens.min()}, {tokens.max()}]")
    B, N = len(prompts) * jax.process_count() * s.num_samples, s.max_new_tokens
    unrolled = decode.unrolls_layers(s, model)
    want = kv_cache.shapes(model.config, B, N)
    if unrolled:
      want = tuple({k: v[1:] for k, v in want.items()} for _ in range(model.config.num_layers))
    if self._cache is None or jax.tree.map(lambda x: x.shape, self._cache) != want:
      self._cache = self._new_cache(model, B, N, unrolled)
    if model.mesh is not None:
      tokens, mask = (sh.put_process_rows(x, (sh.BATCH, sh.SEQ), model.mesh, model.rules)
                      for x in (tokens, mask))
    key = seed if isinstance(seed, jax.Array) else jax.random.key(seed)
    if multi:  # the same key on every process, as one replicated global array
      key = _replicated_key(key, model.mesh)
    return model, self._cache, tokens, mask, key

  def sample_local(self, model: models.Model, prompts: Sequence[Sequence[int]],
                   seed) -> SampleOutput:
    """`self(...)`, as numpy on the host: this process's rows only (all of them with one)."""
    return distributed.local_rows(self(model, prompts, seed))

  def _new_cache(self, model, B, S, unrolled: bool):
    make = lambda: kv_cache.init_cache(model.config, B, S)
    if unrolled:
      make = lambda: decode.per_layer(kv_cache.init_cache(model.config, B, S))
    if model.mesh is None:
      return make()
    return jax.jit(make, out_shardings=_cache_shardings(model, B, S, unrolled))()


def _cache_shardings(model: models.Model, B: int, S: int, unrolled: bool):
  """Where the rows' own cache lives: stacked, or one dict per layer."""
  stacked = kv_cache.cache_shardings(model.config, B, S, model.mesh, model.rules)
  return decode.per_layer_shardings(stacked, model.config.num_layers) if unrolled else stacked


def _replicated_key(key: jax.Array, mesh) -> jax.Array:
  """A PRNG key (typed or raw uint32) as a global array replicated over `mesh`."""
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  data = sh.put(np.asarray(jax.random.key_data(key) if typed else key), sh.replicated(mesh))
  return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key)) if typed else data


GENERATE_CACHE_SIZE = 4  # `generate` keeps the samplers of its last 4 settings


@functools.lru_cache(maxsize=GENERATE_CACHE_SIZE)
def _sampler(settings: SamplingSettings) -> Sampler:
  return Sampler(settings)


def free_generate_cache() -> None:
  """Drops what `generate` keeps between calls: the compiled samplers of its last
  `GENERATE_CACHE_SIZE` settings and the KV buffers each holds for its next call."""
  _sampler.cache_clear()


def generate(model: models.Model, prompts: Sequence[Sequence[int]], num_samples: int,
             max_new_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             eos_ids: Sequence[int] = (), seed: int | jax.Array = 0, pad_id: int = 0,
             layer_loop: str = "auto", weight_layout: str = "tensor") -> SampleOutput:
  """Samples `num_samples` completions of every prompt.

  Args:
    model: a language model (`models.from_pretrained`, `models.init`), sharded or not.
    prompts: P token-id lists of any lengths (left-padded to a bucket here).
    num_samples: G completions per prompt.
    max_new_tokens: N, the most tokens generated per completion.
    temperature: 0 = greedy; otherwise logits are divided by it.
    top_k: keep only the k most likely tokens (0 = off).
    top_p: keep the smallest set of tokens whose probability reaches top_p (1 = off).
    eos_ids: token ids that end a completion (the EOS itself is kept and masked in).
    seed: an int or a jax PRNG key.
    pad_id: the token written after the end.
    layer_loop: 'auto', 'scan' or 'unrolled' (see `SamplingSettings`).
    weight_layout: 'tensor', 'replicated' or 'training' (see `SamplingSettings`).
  Returns:
    `SampleOutput` with rows prompt-major: the G samples of prompt 0 come first.

  The compiled program and its KV buffers (B rows x `max_new_tokens` slots per layer,
  reused by the next call with the same settings) are kept for the last
  `GENERATE_CACHE_SIZE` settings; `free_generate_cache()` releases them. The trainer keeps
  its own `Sampler`s instead.
  """
  settings = SamplingSettings(num_samples, max_new_tokens, float(temperature), int(top_k),
                              float(top_p), tuple(int(e) for e in eos_ids), int(pad_id),
                              layer_loop, weight_layout)
  return _sampler(settings)(model, prompts, seed)
