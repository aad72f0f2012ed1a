"""The KV cache: keys and values of every layer, preallocated to a fixed length S.

A cache is a tuple with one dict per layer, so each layer's buffers are updated in place and
read where they lie (a model with a cache runs its layers as a Python loop over unstacked
parameters, see `Transformer`; slicing a stacked cache inside a decode loop would copy it on
every step):

  {'k': [B, K, Dh, S], 'v': [B, K, S, Dh]}

Heads come before slots, so attention reads each (row, kv head) block contiguously with no
transpose per step. Keys are stored slot-minor ([Dh, S]) so that queries times keys is a plain
[G, Dh] x [Dh, S] matmul per (row, kv head): with slot-major keys the CPU matmul library
transposed every key block on every decode step, which made the score product 2.6x slower
than the probability-times-values one.

Slots are written (`dynamic_update_slice`) at a position shared by the whole batch: prompts
are left-padded to one length, so slot s holds token s of every row, and the per-row validity
of each slot travels separately as `kv_mask_BS`.

Shared prefix (the sampler's decode cache). The G samples of a prompt share its prompt's keys
and values, so the sampler keeps them once per prompt and adds, per layer,

  {'prefix_k': [P, K, Dh, S0], 'prefix_v': [P, K, S0, Dh]}    with B = P * G rows,

where rows [p*G, (p+1)*G) belong to prompt p. Slots [0, S0) are then the prefix and slots
[S0, S0 + S) the rows' own buffers: `cache_index` and `kv_mask_BS` count the prefix slots, so
a model call sees the same S0 + S slots as with one unshared buffer. Reading the prefix once
per prompt instead of once per row divides its memory traffic by G, and the queries of the G
rows of a prompt become one larger matmul against it.
"""
import jax
import jax.numpy as jnp

from jaxrl_llm import sharding as sh
from jaxrl_llm.models.config import ModelConfig

K_AXES = (sh.BATCH, sh.KV_HEADS, sh.HEAD_DIM, sh.CACHE_SEQ)
V_AXES = (sh.BATCH, sh.KV_HEADS, sh.CACHE_SEQ, sh.HEAD_DIM)


def layer_shape(cfg: ModelConfig, batch: int, length: int) -> tuple[int, ...]:
  """The shape of one layer's value buffer [B, K, S, Dh] (keys: [B, K, Dh, S])."""
  return (batch, cfg.num_kv_heads, length, cfg.head_dim)


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=None) -> tuple[dict, ...]:
  """Zeros for keys [B, K, Dh, S] and values [B, K, S, Dh] of each layer (dtype: compute dtype)."""
  dtype = dtype or cfg.jnp_dtype
  k_shape = (batch, cfg.num_kv_heads, cfg.head_dim, length)
  return tuple({"k": jnp.zeros(k_shape, dtype), "v": jnp.zeros(layer_shape(cfg, batch, length), dtype)}
               for _ in range(cfg.num_layers))


def cache_shardings(cfg: ModelConfig, batch: int, length: int, mesh, rules) -> tuple[dict, ...]:
  """NamedShardings of a cache made by `init_cache` on `mesh`."""
  k = sh.named_sharding(K_AXES, (batch, cfg.num_kv_heads, cfg.head_dim, length), mesh, rules)
  v = sh.named_sharding(V_AXES, layer_shape(cfg, batch, length), mesh, rules)
  return tuple({"k": k, "v": v} for _ in range(cfg.num_layers))


def with_shared_prefix(prefix_cache: tuple, cache: tuple) -> tuple[dict, ...]:
  """Per-layer decode caches that read `prefix_cache` (P rows) under `cache` (B = P*G rows)."""
  return tuple(dict(own, prefix_k=pre["k"], prefix_v=pre["v"])
               for pre, own in zip(prefix_cache, cache))


def own_part(cache: tuple) -> tuple[dict, ...]:
  """The rows' own buffers of a cache, without any shared prefix (what the sampler donates)."""
  return tuple({"k": layer["k"], "v": layer["v"]} for layer in cache)


def _prefix_len(layer: dict) -> int:
  return layer["prefix_k"].shape[-1] if "prefix_k" in layer else 0


def update(layer: dict, k_BKTd: jax.Array, v_BKTd: jax.Array, cache_index) -> dict:
  """Writes T new keys and values at slots [cache_index, cache_index + T), in place."""
  index = cache_index - _prefix_len(layer)  # prefix slots are never written
  k_BKdT = k_BKTd.transpose(0, 1, 3, 2).astype(layer["k"].dtype)
  return dict(layer,
              k=jax.lax.dynamic_update_slice(layer["k"], k_BKdT, (0, 0, 0, index)),
              v=jax.lax.dynamic_update_slice(layer["v"], v_BKTd.astype(layer["v"].dtype),
                                             (0, 0, index, 0)))


def _by_prompt(x_BKGTz: jax.Array, prompts: int) -> jax.Array:
  """[B, K, G, T, z] -> [P, K, R*G*T, z]: the R = B/P rows of each prompt stacked as queries."""
  B, K, G, T, z = x_BKGTz.shape
  x = x_BKGTz.reshape(prompts, B // prompts, K, G, T, z).transpose(0, 2, 1, 3, 4, 5)
  return x.reshape(prompts, K, (B // prompts) * G * T, z)


def _by_row(x_PKQz: jax.Array, G: int, T: int) -> jax.Array:
  """Inverse of `_by_prompt`: [P, K, R*G*T, z] -> [B, K, G, T, z]."""
  P, K, Q, z = x_PKQz.shape
  R = Q // (G * T)
  x = x_PKQz.reshape(P, K, R, G, T, z).transpose(0, 2, 1, 3, 4, 5)
  return x.reshape(P * R, K, G, T, z)


def scores(layer: dict, q_BKGTd: jax.Array) -> jax.Array:
  """Float32 q . k [B, K, G, T, S] over all slots (prefix first) of a written layer cache."""
  dt = q_BKGTd.dtype
  own_BKGTS = jnp.einsum("BKGTd,BKdS->BKGTS", q_BKGTd, layer["k"].astype(dt),
                         preferred_element_type=jnp.float32)
  if "prefix_k" not in layer:
    return own_BKGTS
  prefix_k = layer["prefix_k"]
  q_PKQd = _by_prompt(q_BKGTd, prefix_k.shape[0])
  pre_PKQS = jnp.einsum("PKQd,PKdS->PKQS", q_PKQd, prefix_k.astype(dt),
                        preferred_element_type=jnp.float32)
  _, _, G, T, _ = q_BKGTd.shape
  return jnp.concatenate([_by_row(pre_PKQS, G, T), own_BKGTS], axis=-1)


def mix(layer: dict, probs_BKGTS: jax.Array) -> jax.Array:
  """Attention output [B, K, G, T, Dh]: the values weighted by `probs` (slots as in `scores`)."""
  dt = probs_BKGTS.dtype
  S0 = _prefix_len(layer)
  out_BKGTd = jnp.einsum("BKGTS,BKSd->BKGTd", probs_BKGTS[..., S0:], layer["v"].astype(dt))
  if not S0:
    return out_BKGTd
  prefix_v = layer["prefix_v"]
  _, _, G, T, _ = probs_BKGTS.shape
  probs_PKQS = _by_prompt(probs_BKGTS[..., :S0], prefix_v.shape[0])
  pre_PKQd = jnp.einsum("PKQS,PKSd->PKQd", probs_PKQS, prefix_v.astype(dt))
  return out_BKGTd + _by_row(pre_PKQd, G, T)
