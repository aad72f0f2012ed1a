"""The KV cache: keys and values of every layer, preallocated to a fixed length S.

The buffers are stacked over layers, {'k': [L, B, K, Dh, S], 'v': [L, B, K, S, Dh]}: the
scan reads layer i's slice, writes this step's keys and values into it, attends over it,
and hands the new keys and values out; they are written into the stacked buffers after the
scan (`write`), in place. (The sampler may split them into one dict of [B, K, Dh, S] /
[B, K, S, Dh] buffers per layer for its unrolled decode on a CPU, `sampling.decode`;
`write` and the attention read either.)

Paged (the continuous sampler's cache, `sampling.continuous`). A pool of pages of Q token
slots, {'pages_k': [L, NP, K, Dh, Q], 'pages_v': [L, NP, K, Q, Dh]} (the same layouts, a page
in place of a row), and per decode slot a block table of page ids: a slot's sequence is the
concatenation of its pages, so its memory follows its length, and the G samples of a prompt
share the prompt's pages by naming them in their tables. What a step reads is located by a
`PagedIndex` passed where a contiguous cache takes `cache_index`; its new keys and values
are written by the caller after the step (`write`).

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
from flax import struct

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


PAGE_K_AXES = (sh.LAYERS, None, sh.KV_HEADS, sh.HEAD_DIM, None)
PAGE_V_AXES = (sh.LAYERS, None, sh.KV_HEADS, None, sh.HEAD_DIM)


@struct.dataclass
class PagedIndex:
  """What one decode step of M slots (one token each) reads of a paged cache.

  The slots come in groups (`groups`, static (start, end) ranges over the M slots), each
  reading its own number of pages: a caller that orders its slots by length makes every
  group read about its own longest sequence instead of the batch's.

  Attributes:
    block_table: int32 [M, PP], the pages of each slot's sequence in order.
    read_branch: int32 [len(groups)], which entry of `read_pages` each group reads.
    read_pages: (static) the numbers of leading block-table pages a read may cover,
      increasing; a group reads the smallest that holds its longest live slot.
    groups: (static) the slot ranges that read together.
  """
  block_table: jax.Array
  read_branch: jax.Array
  read_pages: tuple[int, ...] = struct.field(pytree_node=False, default=())
  groups: tuple[tuple[int, int], ...] = struct.field(pytree_node=False, default=())


def page_shapes(cfg: ModelConfig, num_pages: int, page_size: int) -> dict[str, tuple[int, ...]]:
  """Shapes of a stacked page pool: keys [L, NP, K, Dh, Q], values [L, NP, K, Q, Dh]."""
  L, K, Dh = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
  return {"pages_k": (L, num_pages, K, Dh, page_size),
          "pages_v": (L, num_pages, K, page_size, Dh)}


def init_pages(cfg: ModelConfig, num_pages: int, page_size: int, dtype=None) -> dict:
  """Zeros for a stacked page pool (dtype: the compute dtype)."""
  dtype = dtype or cfg.jnp_dtype
  return {name: jnp.zeros(shape, dtype)
          for name, shape in page_shapes(cfg, num_pages, page_size).items()}


def page_shardings(cfg: ModelConfig, num_pages: int, page_size: int, mesh, rules,
                   sharded: bool = False) -> dict:
  """NamedShardings of a stacked page pool on `mesh`: KV heads over `tensor`, and with
  `sharded` the pages over the batch axes (one part of the pool per data shard's engine)."""
  shape = page_shapes(cfg, num_pages, page_size)
  page = (sh.BATCH,) if sharded else (None,)
  k_axes, v_axes = (a[:1] + page + a[2:] for a in (PAGE_K_AXES, PAGE_V_AXES))
  return {"pages_k": sh.named_sharding(k_axes, shape["pages_k"], mesh, rules),
          "pages_v": sh.named_sharding(v_axes, shape["pages_v"], mesh, rules)}


def as_pages(cache, page_size: int):
  """A contiguous cache of P rows x S slots (S a multiple of Q) as P * S/Q pages, row-major:
  row p's slots [j*Q, (j+1)*Q) become page p * S/Q + j."""
  if isinstance(cache, tuple):
    return tuple(as_pages(layer, page_size) for layer in cache)
  k, v = cache["k"], cache["v"]  # [..., P, K, Dh, S], [..., P, K, S, Dh]
  *lead, P, K, Dh, S = k.shape
  n, Q, m = S // page_size, page_size, len(lead)
  k = k.reshape(*lead, P, K, Dh, n, Q)
  k = jnp.moveaxis(k, m + 3, m + 1).reshape(*lead, P * n, K, Dh, Q)
  v = v.reshape(*lead, P, K, n, Q, Dh)
  v = jnp.moveaxis(v, m + 2, m + 1).reshape(*lead, P * n, K, Q, Dh)
  return {"pages_k": k, "pages_v": v}


def put_pages(pool, pages, first: int = 0):
  """`pool` with `pages` (as made by `as_pages`) written at page ids [first, first + n)."""
  if isinstance(pool, tuple):
    return tuple(put_pages(a, b, first) for a, b in zip(pool, pages))
  lead = pool["pages_k"].ndim - 4
  at = lambda x: (0,) * lead + (first, 0, 0, 0)
  return {name: jax.lax.dynamic_update_slice(pool[name], pages[name].astype(pool[name].dtype),
                                             at(pool[name]))
          for name in ("pages_k", "pages_v")}


def write_pages(pool, k_new: jax.Array, v_new: jax.Array, page, offset):
  """`pool` (stacked [L, ...], or one dict per layer) with each slot's new key and value
  ([L, M, K, 1, Dh], or one pair per layer) written at its page and offset ([M])."""
  if isinstance(pool, tuple):
    return tuple(write_pages(layer, k, v, page, offset)
                 for layer, k, v in zip(pool, k_new, v_new))
  if k_new.ndim == 5:  # stacked over layers
    return jax.vmap(write_pages, in_axes=(0, 0, 0, None, None))(pool, k_new, v_new, page, offset)
  pages_k = pool["pages_k"].at[page, :, :, offset].set(k_new[:, :, 0].astype(pool["pages_k"].dtype))
  pages_v = pool["pages_v"].at[page, :, offset, :].set(v_new[:, :, 0].astype(pool["pages_v"].dtype))
  return {"pages_k": pages_k, "pages_v": pages_v}


def pending(cache):
  """The new keys and values a paged forward left for `write_pages`: (k, v), stacked, or
  one tuple each over layers."""
  if isinstance(cache, tuple):
    return tuple(layer["new_k"] for layer in cache), tuple(layer["new_v"] for layer in cache)
  return cache["new_k"], cache["new_v"]


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
  scan), none for one layer's buffers. A paged cache takes a `PagedIndex` as `cache_index`:
  its pages stay as they are (a decode step may run under a `lax.switch`, which would copy
  a pool it wrote), the new keys and values are kept beside them for attention to read,
  and the caller writes them afterwards (`pending`, `write_pages`).
  """
  if isinstance(cache_index, PagedIndex):  # kept beside the pages, written by `write_pages`
    if k_new.shape[-2] != 1:
      raise ValueError(f"a paged cache takes one new token per slot, got {k_new.shape[-2]}")
    return dict(cache, new_k=k_new, new_v=v_new)
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
