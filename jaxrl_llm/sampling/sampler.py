"""The sampling program and the `Sampler` that keeps it compiled (see the package docstring)."""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_llm import distributed, models, platform
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import kv_cache
from jaxrl_llm.sampling import choose, continuous, decode
from jaxrl_llm.sampling import output
from jaxrl_llm.sampling.output import SampleOutput
from jaxrl_llm.sampling.settings import SamplingSettings, engine_kind

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


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
  routing_BNLk: jax.Array | None = None  # an MoE model's experts of each token fed back


def _record(st: _LoopState, token_B, logp_B, budget_B, s: SamplingSettings) -> _LoopState:
  """Writes column t (for rows still running) and advances t."""
  live_B = ~st.done_B & (st.lengths_B < budget_B)
  col = jnp.where(live_B, token_B, s.pad_id)
  tokens_BN = jax.lax.dynamic_update_slice(st.tokens_BN, col[:, None], (0, st.t))
  logprobs_BN = jax.lax.dynamic_update_slice(
      st.logprobs_BN, jnp.where(live_B, logp_B, 0.0)[:, None], (0, st.t))
  return st.replace(t=st.t + 1, token_B=token_B, done_B=st.done_B | (live_B & choose.is_eos(token_B, s)),
                    tokens_BN=tokens_BN, logprobs_BN=logprobs_BN,
                    lengths_B=st.lengths_B + live_B.astype(jnp.int32))


def _sample_program(model: models.Model, cache, tokens_PS, mask_PS, budget_B, key,
                    s: SamplingSettings):
  P, S0 = tokens_PS.shape
  G, N = s.num_samples, s.max_new_tokens
  B = P * G
  S = S0 + N
  unrolled = isinstance(cache, tuple)
  model, tune = decode.decode_model(model, s, unrolled)
  cfg = model.config

  # Prefill: each prompt once, into a cache its G samples then share as their prefix.
  prompt_cache, logits_PV, positions_PS, *prompt_routing = decode.prefill(
      model, tokens_PS, mask_PS, tune, unrolled, with_router=cfg.is_moe)
  if model.mesh is not None:
    own = kv_cache.shapes(model.config, B, N, tune.key_layout)
    cache = jax.lax.with_sharding_constraint(cache, _cache_shardings(model, own, unrolled))
  cache = kv_cache.with_shared_prefix(prompt_cache, cache)
  kv_mask_BS = jnp.zeros((B, S), jnp.int32).at[:, :S0].set(jnp.repeat(mask_PS, G, axis=0))
  next_position_B = jnp.repeat(positions_PS[:, -1] + 1, G)

  # Row b is request b: its column t draws from fold_in(fold_in(key, b), t) (`choose`), as in
  # the continuous engine. Threefry counts per entry, so XLA fuses the draw into the token
  # choice, and rows split over devices draw only their own entries.
  keys_B = choose.request_keys(key, B)
  token_B, logp_B = choose.choose_tokens(jnp.repeat(logits_PV, G, axis=0),
                                         choose.token_keys(keys_B, 0), s)
  st = _LoopState(t=jnp.int32(0), token_B=token_B, done_B=jnp.zeros((B,), bool),
                  tokens_BN=jnp.full((B, N), s.pad_id, jnp.int32),
                  logprobs_BN=jnp.zeros((B, N), jnp.float32), lengths_B=jnp.zeros((B,), jnp.int32),
                  kv_mask_BS=kv_mask_BS, cache=cache)
  if cfg.is_moe:  # routing replay's record: -1 until a token is fed back
    st = st.replace(routing_BNLk=decode.empty_record(cfg, B, N))
  st = _record(st, token_B, logp_B, budget_B, s)

  def cond(st):
    return (st.t < N) & ~jnp.all(st.done_B | (st.lengths_B >= budget_B))

  def step(st):  # feed the token of column t - 1, choose the token of column t
    slot = S0 + st.t - 1
    kv_mask_BS = jax.lax.dynamic_update_slice(st.kv_mask_BS, jnp.ones((B, 1), jnp.int32), (0, slot))
    positions_B1 = (next_position_B + st.t - 1)[:, None]
    logits_B1V, cache, *routing = decode.forward(
        model, st.token_B[:, None], positions_B1, kv_mask_BS, st.cache, slot, tune=tune,
        with_router=cfg.is_moe)
    if cfg.is_moe:  # the experts of column t - 1's token
      st = st.replace(routing_BNLk=jax.lax.dynamic_update_slice(
          st.routing_BNLk, routing[0]["experts"], (0, st.t - 1, 0, 0)))
    token_B, logp_B = choose.choose_tokens(logits_B1V[:, 0], choose.token_keys(keys_B, st.t), s)
    return _record(st.replace(kv_mask_BS=kv_mask_BS, cache=cache), token_B, logp_B, budget_B, s)

  st = jax.lax.while_loop(cond, step, st)
  out = output.from_lengths(st.tokens_BN, st.logprobs_BN, st.lengths_B, st.done_B)
  if cfg.is_moe:
    out = out.replace(routing=decode.sample_routing(prompt_routing[0], st.routing_BNLk, G))
  return out, kv_cache.own_part(st.cache), {"steps": st.t}


class Sampler:
  """Compiled sampling for one model config and settings; keeps the donated cache buffer."""

  def __init__(self, settings: SamplingSettings, buckets: Sequence[int] = DEFAULT_BUCKETS):
    self.settings = settings
    self.buckets = tuple(sorted(buckets))

    def placed(model, *args):
      static = self.engine(model) == "static"
      program = _sample_program if static else continuous.continuous_program
      out, cache, stats = program(for_sampling(model), *args, s=settings)
      return output.by_rows(out, model), cache, stats  # rows where the trainer wants them
    self._program = jax.jit(placed, donate_argnums=(1,), compiler_options=models.COMPILER_OPTIONS)
    self._cache = None
    self._prefix_bytes = 0  # the static engine's prompt cache of the last call (a temporary)
    self.stats = {}

  def engine(self, model: models.Model) -> str:
    """'static' or 'continuous': the engine that samples `model` (`settings.engine`, 'auto'
    decided for where the model lives: `engine_kind`)."""
    return engine_kind(self.settings, "samples", platform.of(model.mesh))

  def num_compilations(self) -> int:
    return self._program._cache_size()

  @property
  def cache(self):
    """The KV buffers kept for the next call (None before the first call or after `free`):
    static, B x (max_new_tokens) slots per layer, sharded over the batch and KV heads;
    continuous, the page pool (`continuous.pool_pages` pages per layer)."""
    return self._cache

  def free(self) -> None:
    """Drops the kept KV buffers (the next call allocates them again)."""
    self._cache = None

  def __call__(self, model: models.Model, prompts: Sequence[Sequence[int]], seed,
               budgets: Sequence[int] | None = None) -> SampleOutput:
    """Samples the prompts; returns global arrays (rows prompt-major).

    With several processes, `prompts` are this process's prompts: the batch is every
    process's prompts in process order, all padded to one bucket, and `model` must be
    on a mesh. `sample_local` returns just this process's rows on the host.
    `budgets`: the most new tokens of each of this process's rows (prompt-major, each in
    [1, max_new_tokens]; default max_new_tokens): a completion that reaches its budget
    without an EOS ends there, truncated.
    """
    out, self._cache, self.stats = self._program(*self._arguments(model, prompts, seed,
                                                                  budgets))
    return out

  def kv_bytes(self) -> int:
    """Bytes of the KV buffers the last call used: the kept buffers (rows' own slots, or the
    page pool with the prompts' pages) and, for the static engine, the prompts' prefix."""
    if self._cache is None:
      return 0
    kept = sum(x.nbytes for x in jax.tree.leaves(self._cache))
    return kept + self._prefix_bytes

  def lower(self, model: models.Model, prompts: Sequence[Sequence[int]], seed=0):
    """The sampling program for these arguments, lowered (`.compile().as_text()` shows it)."""
    return self._program.lower(*self._arguments(model, prompts, seed, None))

  def lower_shapes(self, model: models.Model, num_prompts: int, prompt_len: int):
    """The program for `num_prompts` prompts (every process's) padded to `prompt_len`'s
    bucket, lowered from shapes alone: nothing is allocated, so `model` may hold
    `jax.ShapeDtypeStruct`s and live on devices this host does not have (`launch.compile`
    compiles it for a TPU slice)."""
    length = self._padded_length(model, prompt_len)
    cache = self.cache_structs(model, num_prompts, prompt_len)
    rows = num_prompts * self.settings.num_samples
    placed = lambda shape, names: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=None if (
        model.mesh is None) else sh.named_sharding(names, shape, model.mesh, model.rules))
    key = jax.eval_shape(lambda: jax.random.key(0))
    if model.mesh is not None:
      key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sh.replicated(model.mesh))
    return self._program.lower(model, cache, placed((num_prompts, length), (sh.BATCH, sh.SEQ)),
                               placed((num_prompts, length), (sh.BATCH, sh.SEQ)),
                               placed((rows,), (sh.BATCH,)), key)

  def cache_structs(self, model: models.Model, num_prompts: int, prompt_len: int):
    """The KV buffers a call for `num_prompts` prompts padded to `prompt_len`'s bucket
    keeps, as `jax.ShapeDtypeStruct`s placed where the program wants them (nothing is
    allocated)."""
    length = self._padded_length(model, prompt_len)
    want, unrolled, shards = self._cache_layout(model, num_prompts, length)
    stacked = want[0] if unrolled else want
    if unrolled:
      stacked = {k: (model.config.num_layers,) + v for k, v in stacked.items()}
    as_structs = lambda shapes: {k: jax.ShapeDtypeStruct(v, model.config.jnp_dtype)
                                 for k, v in shapes.items()}
    cache = tuple(map(as_structs, want)) if unrolled else as_structs(want)
    if model.mesh is None:
      return cache
    return jax.tree.map(lambda x, where: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where),
                        cache, _cache_shardings(model, stacked, unrolled, shards))

  def _padded_length(self, model: models.Model, longest: int) -> int:
    """The prompt length a call pads to: the bucket of its longest prompt (the continuous
    engine: in whole pages)."""
    length = bucket_length(longest, self.buckets)
    if self.engine(model) == "continuous":
      length = -(-length // self.settings.page_size) * self.settings.page_size
    return length

  def _cache_layout(self, model: models.Model, num_prompts: int, length: int):
    """(the kept KV buffers' shapes for `num_prompts` prompts of `length` slots, whether the
    layers run unrolled, the continuous engine's data shards)."""
    s, model = self.settings, for_sampling(model)
    unrolled, shards = decode.unrolls_layers(s, model), 1
    if self.engine(model) == "static":
      want = kv_cache.shapes(model.config, num_prompts * s.num_samples, s.max_new_tokens,
                             decode.tuning(model).key_layout)
    else:
      shards = continuous.batch_shards(model, num_prompts)[1]
      want = kv_cache.page_shapes(model.config, continuous.pool_pages(num_prompts, length, s,
                                                                      shards), s.page_size,
                                  decode.tuning(model).key_layout)
    if unrolled:
      want = tuple({k: v[1:] for k, v in want.items()} for _ in range(model.config.num_layers))
    return want, unrolled, shards

  def _arguments(self, model, prompts, seed, budgets):
    """Checks the prompts; returns the program's (model, cache, tokens, mask, budgets, key)."""
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
    length = self._padded_length(model, distributed.max_int(max(len(p) for p in prompts)))
    tokens, mask = left_pad(prompts, length, s.pad_id)
    if tokens.max() >= model.config.vocab_size or tokens.min() < 0:
      raise ValueError(f"prompt token ids must lie in [0, {model.config.vocab_size}); got "
                       f"[{tokens.min()}, {tokens.max()}]")
    P = len(prompts) * jax.process_count()
    N = s.max_new_tokens
    want, unrolled, shards = self._cache_layout(model, P, length)
    self._prefix_bytes = 0 if self.engine(model) != "static" else sum(  # the prompts' shared cache
        int(np.prod(shape)) * jnp.dtype(model.config.jnp_dtype).itemsize
        for shape in kv_cache.shapes(model.config, P, length).values())
    if self._cache is None or jax.tree.map(lambda x: x.shape, self._cache) != want:
      self._cache = None  # freed before the new buffers are made
      self._cache = self._new_cache(model, want, unrolled, shards)
    rows = len(prompts) * s.num_samples
    budget = np.full((rows,), N, np.int32) if budgets is None else np.asarray(budgets, np.int32)
    if budget.shape != (rows,) or budget.min() < 1 or budget.max() > N:
      raise ValueError(f"budgets: expected {rows} ints (prompts x num_samples) in [1, {N}], "
                       f"got shape {budget.shape} with values in "
                       f"[{budget.min(initial=0)}, {budget.max(initial=0)}]")
    if model.mesh is not None:
      tokens, mask = (sh.put_process_rows(x, (sh.BATCH, sh.SEQ), model.mesh, model.rules)
                      for x in (tokens, mask))
      budget = sh.put_process_rows(budget, (sh.BATCH,), model.mesh, model.rules)
    key = seed if isinstance(seed, jax.Array) else jax.random.key(seed)
    if multi:  # the same key on every process, as one replicated global array
      key = _replicated_key(key, model.mesh)
    return model, self._cache, tokens, mask, budget, key

  def sample_local(self, model: models.Model, prompts: Sequence[Sequence[int]],
                   seed) -> SampleOutput:
    """`self(...)`, as numpy on the host: this process's rows only (all of them with one)."""
    return distributed.local_rows(self(model, prompts, seed))

  def _new_cache(self, model, shapes, unrolled: bool, shards: int):
    """Zeros of `shapes` (stacked, or one dict per layer) where the program wants them."""
    stacked = shapes[0] if unrolled else shapes
    if unrolled:
      stacked = {k: (model.config.num_layers,) + v for k, v in stacked.items()}
    dt = model.config.jnp_dtype
    make = lambda: {k: jnp.zeros(v, dt) for k, v in stacked.items()}
    if unrolled:
      make = lambda: decode.per_layer({k: jnp.zeros(v, dt) for k, v in stacked.items()})
    if model.mesh is None:
      return make()
    return jax.jit(make, out_shardings=_cache_shardings(model, stacked, unrolled, shards))()


def _cache_shardings(model: models.Model, stacked: dict, unrolled: bool, shards: int = 1):
  """Where the kept KV buffers live (shapes `stacked`): stacked, or one dict per layer
  (`shards`: the continuous engines whose parts of the page pool lie on their own devices)."""
  cfg, model = model.config, for_sampling(model)
  if "v" in stacked:  # the rows' own buffers: values [L, B, K, N, Dh]
    shardings = kv_cache.cache_shardings(cfg, stacked["v"][1], stacked["v"][-2], model.mesh,
                                         model.rules, kv_cache.key_layout(stacked))
  else:  # the page pool: split over the data shards' engines, if any
    layout = kv_cache.page_layout(stacked)
    values = stacked[kv_cache.PAGE_LAYOUTS[layout][1]]  # [L, NP, K, Q, Dh] or [L, NP, Q, K, Dh]
    Q = values[3] if layout == "slot_minor" else values[2]
    shardings = kv_cache.page_shardings(cfg, values[1], Q, model.mesh, model.rules,
                                        sharded=shards > 1, key_layout=layout)
  return decode.per_layer_shardings(shardings, cfg.num_layers) if unrolled else shardings


def for_sampling(model: models.Model) -> models.Model:
  """`model` under the rules its sampling programs run with (`sharding.sampling_rules`: with
  a context axis, its devices decode rows of their own)."""
  return model.replace(rules=sh.sampling_rules(model.mesh, model.rules))


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
             layer_loop: str = "auto", weight_layout: str = "tensor", engine: str = "auto",
             slots: int = 0, page_size: int = 32) -> SampleOutput:
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
    engine: 'auto', 'static' or 'continuous'; slots, page_size: the continuous engine's
      decode slots (0: half of the P*G requests) and KV page size (see
      `SamplingSettings`). Every engine returns the same completion for the same request
      and seed (up to float rounding of near ties).
  Returns:
    `SampleOutput` with rows prompt-major: the G samples of prompt 0 come first.

  The compiled program and its KV buffers (B rows x `max_new_tokens` slots per layer,
  reused by the next call with the same settings) are kept for the last
  `GENERATE_CACHE_SIZE` settings; `free_generate_cache()` releases them. The trainer keeps
  its own `Sampler`s instead.
  """
  settings = SamplingSettings(num_samples, max_new_tokens, float(temperature), int(top_k),
                              float(top_p), tuple(int(e) for e in eos_ids), int(pad_id),
                              layer_loop, weight_layout, engine, int(slots), int(page_size))
  return _sampler(settings)(model, prompts, seed)
