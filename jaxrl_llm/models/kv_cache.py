"""The KV cache: keys and values of every layer, preallocated to a fixed length S.

The buffers are stacked over layers, {'k': [L, B, K, Dh, S], 'v': [L, B, K, S, Dh]}: the
scan reads layer i's slice, writes this step's keys and values into it, attends over it,
and hands the new keys and values out; they are written into the stacked buffers after the
scan (`write`), in place. (The sampler may split them into one dict of [B, K, Dh, S] /
[B, K, S, Dh] buffers per layer for its unrolled decode on a CPU, `sampling.decode`;
`write` and the attention read either.)

Heads come before slots, so attention reads each (row, kv head) block contiguously with no
transpose per step. Keys are stored slot-minor ([Dh, S]) so that queries times keys is a plain
[G, Dh] x [Dh, S] matmul per (row, kv head): with slot-major keys the CPU matmul library
transposed every key block on every decode step, which made the score product several
times slower than the probability-times-values one.

Slots are written (`dynamic_update_slice`) at a position shared by the whole batch: prompts
are left-padded to one length, so slot s holds token s of every row, and the per-row validity
of each slot travels separately as `kv_mask_BS`.

Shared prefix (the sampler's decode cache). The G samples of a prompt share its prompt's keys
and values, so the sampler keeps them once per prompt and adds, per layer,

  {'prefix_k': [P, K, Dh, S0], 'prefix_v': [P, K, S0, Dh]}    with B = P * G rows

(with a leading L in the stacked layout), where rows [p*G, (p+1)*G) belong to prompt p. Slots
[0, S0) are then the prefix and slots [S0, S0 + S) the rows' own buffers: `cache_index` and
`kv_mask_BS` count the prefix slots, so a model call sees the same S0 + S slots as with one
unshared buffer. Reading the prefix once per prompt instead of once per row divides its memory
traffic by G, and the queries of the G rows of a prompt become one larger matmul against it.
"""
import jax
import jax.numpy as jnp

from jaxrl_llm import sharding as sh
from jaxrl_llm.models.config import ModelConfig

K_AXES = (sh.LAYERS, sh.BATCH, sh.KV_HEADS, sh.HEAD_DIM, sh.CACHE_SEQ)
V_AXES = (sh.LAYERS, sh.BATCH, sh.KV_HEADS, sh.CACHE_SEQ, sh.HEAD_DIM)


def shapes(cfg: ModelConfig, batch: int, length: int) -> dict[str, tuple[int, ...]]:
  """Shapes of a stacked cache: keys [L, B, K, Dh, S], values [L, B, K, S, Dh]."""
  L, K, Dh = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
  return {"k": (L, batch, K, Dh, length), "v": (L, batch, K, length, Dh)}


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=None) -> dict[str, jax.Array]:
  """Zeros for keys and values of every layer, stacked (dtype: the compute dtype)."""
  dtype = dtype or cfg.jnp_dtype
  return {name: jnp.zeros(shape, dtype) for name, shape in shapes(cfg, batch, length).items()}


def cache_shardings(cfg: ModelConfig, batch: int, length: int, mesh, rules) -> dict:
  """NamedShardings of a stacked cache made by `init_cache` on `mesh`."""
  shape = shapes(cfg, batch, length)
  return {"k": sh.named_sharding(K_AXES, shape["k"], mesh, rules),
          "v": sh.named_sharding(V_AXES, shape["v"], mesh, rules)}


def with_shared_prefix(prefix_cache, cache):
  """A decode cache that reads `prefix_cache` (P rows) under `cache` (B = P*G rows)."""
  if isinstance(cache, tuple):
    return tuple(with_shared_prefix(pre, own) for pre, own in zip(prefix_cache, cache))
  return dict(cache, prefix_k=prefix_cache["k"], prefix_v=prefix_cache["v"])


def own_part(cache):
  """The rows' own buffers of a cache, without any shared prefix (what the sampler donates)."""
  if isinstance(cache, tuple):
    return tuple(own_part(layer) for layer in cache)
  return {"k": cache["k"], "v": cache["v"]}


def _prefix_len(cache: dict) -> int:
  return cache["prefix_k"].shape[-1] if "prefix_k" in cache else 0


def write(cache: dict, k_new: jax.Array, v_new: jax.Array, cache_index) -> dict:
  """Writes T new keys and values [..., B, K, T, Dh] at slots [cache_index, cache_index + T).

  The leading dims are the cache's: [L] for a stacked cache (all layers at once, after the
  scan), none for one layer's buffers.
  """
  index = cache_index - _prefix_len(cache)  # prefix slots are never written
  lead = (0,) * (k_new.ndim - 2)
  k_new = jnp.swapaxes(k_new, -1, -2).astype(cache["k"].dtype)  # keys are stored [Dh, S]
  return dict(cache, k=jax.lax.dynamic_update_slice(cache["k"], k_new, lead + (0, index)),
              v=jax.lax.dynamic_update_slice(cache["v"], v_new.astype(cache["v"].dtype),
                                             lead + (index, 0)))



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
  """Float32 q . k [B, K, G, T, S] over all slots (prefix first) of one layer's cache."""
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
