"""The KV cache: keys and values of every layer, preallocated to a fixed length S.

The buffers are stacked over layers, {'k': [L, B, K, Dh, S], 'v': [L, B, K, S, Dh]}: the
scan reads layer i's slice, writes this step's keys and values into it, attends over it,
and hands the new keys and values out; they are written into the stacked buffers after the
scan (`write`), in place. (The sampler may split them into one dict of [B, K, Dh, S] /
[B, K, S, Dh] buffers per layer for its unrolled decode on a CPU, `sampling.decode`;
`write` and the attention read either.)

Paged (the continuous sampler's cache, `sampling.continuous`). A pool of pages of Q token
slots, {'pages_k': [L, NP, K, Dh, Q], 'pages_v': [L, NP, K, Q, Dh]} (the same layouts, a page
in place of a row; with slot-major keys, token-major pages: `PAGE_LAYOUTS`), and per decode
slot a block table of page ids: a slot's sequence is the concatenation of its pages, so its
memory follows its length, and the G samples of a prompt share the prompt's pages by naming
them in their tables. What a step reads is located by a `PagedIndex` passed where a
contiguous cache takes `cache_index`; its new keys and values are written by the caller
after the step (`write`).

Heads come before slots, so attention reads each (row, kv head) block contiguously with no
transpose per step. Keys are stored slot-minor ([Dh, S]) so that queries times keys is a plain
[G, Dh] x [Dh, S] matmul per (row, kv head): with slot-major keys the CPU matmul library
transposed every key block on every decode step, which made the score product several
times slower than the probability-times-values one. That is one of two key layouts
(`KEY_LAYOUTS`), told apart by the name of the keys' buffer (every function here takes
either; the sampler picks one per platform, `sampling.DECODE_TUNING`):

  'slot_minor'  'k':    [..., K, Dh, S], the CPU's and the GPU's;
  'slot_major'  'k_sd': [..., K, S, Dh], as the values: the TPU's.

A slot-major cache is also written differently while decoding: a layer's one new token is
not written into its slice (`write` keeps it beside, as for pages); attention reads the
unwritten slice with the new key and value selected in at their slot, and the stacked
buffers are written once, after the layer scan. XLA:TPU fuses that select into the
attention matmuls, so a step reads each layer's slice where it lies. Written first, the
slice was copied out of the stacked buffer and back every step, and a slot-minor key
column fills a whole (8, 128) tile per 8 head dims: for the Qwen3-1.7B recipe's sampler
(`launch.compile --config=qwen3_gsm8k:tpu_v5e_8,size=1.7b --programs=sampler`, v5e:2x4),
HBM traffic per decode step and chip fell from 9.9 GB to 4.7 (the copies were 3.8 GB, the
key columns 1.4). On a CPU the select is a copy of its own, so the CPU keeps slot-minor
keys, written in place.

Slots are written (`dynamic_update_slice`) at a position shared by the whole batch: prompts
are left-padded to one length, so slot s holds token s of every row, and the per-row validity
of each slot travels separately as `kv_mask_BS`.

Shared prefix (the sampler's decode cache). The G samples of a prompt share its prompt's keys
and values, so the sampler keeps them once per prompt and adds, per layer,

  {'prefix_k': [P, K, Dh, S0], 'prefix_v': [P, K, S0, Dh]}    with B = P * G rows

('prefix_k_sd' [P, K, S0, Dh] for slot-major keys; a leading L in the stacked layout),
where rows [p*G, (p+1)*G) belong to prompt p. Slots [0, S0) are then the prefix and slots
[S0, S0 + S) the rows' own buffers: `cache_index` and `kv_mask_BS` count the prefix slots,
so a model call sees the same S0 + S slots as with one unshared buffer. Reading the prefix
once per prompt instead of once per row divides its memory traffic by G, and the queries of
the G rows of a prompt become one larger matmul against it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm import sharding as sh
from jaxrl_llm.models.config import ModelConfig

K_AXES = (sh.LAYERS, sh.BATCH, sh.KV_HEADS, sh.HEAD_DIM, sh.CACHE_SEQ)
V_AXES = (sh.LAYERS, sh.BATCH, sh.KV_HEADS, sh.CACHE_SEQ, sh.HEAD_DIM)
KEY_LAYOUTS = {"slot_minor": "k", "slot_major": "k_sd"}  # layout -> the keys' buffer name
_AXES = {"k": K_AXES, "k_sd": V_AXES, "v": V_AXES}


def key_layout(cache: dict) -> str:
  """A contiguous cache's key layout (`KEY_LAYOUTS`; a dict of buffers or of their shapes)."""
  return "slot_major" if "k_sd" in cache else "slot_minor"


def key_name(cache: dict) -> str:
  """The name of a contiguous cache's keys buffer ('k' or 'k_sd', `KEY_LAYOUTS`)."""
  return KEY_LAYOUTS[key_layout(cache)]


def _slot_axis(name: str) -> int:
  return -1 if name == "k" else -2


def shapes(cfg: ModelConfig, batch: int, length: int,
           key_layout: str = "slot_minor") -> dict[str, tuple[int, ...]]:
  """Shapes of a stacked cache: keys [L, B, K, Dh, S] ('slot_minor') or [L, B, K, S, Dh]
  ('slot_major'), values [L, B, K, S, Dh]."""
  if key_layout not in KEY_LAYOUTS:
    raise ValueError(f"key_layout={key_layout!r}: expected one of {list(KEY_LAYOUTS)}")
  L, K, Dh = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
  keys = (L, batch, K, Dh, length) if key_layout == "slot_minor" else (L, batch, K, length, Dh)
  return {KEY_LAYOUTS[key_layout]: keys, "v": (L, batch, K, length, Dh)}


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=None,
               key_layout: str = "slot_minor") -> dict[str, jax.Array]:
  """Zeros for keys and values of every layer, stacked (dtype: the compute dtype)."""
  dtype = dtype or cfg.jnp_dtype
  return {name: jnp.zeros(shape, dtype)
          for name, shape in shapes(cfg, batch, length, key_layout).items()}


def cache_shardings(cfg: ModelConfig, batch: int, length: int, mesh, rules,
                    key_layout: str = "slot_minor") -> dict:
  """NamedShardings of a stacked cache made by `init_cache` on `mesh`."""
  return {name: sh.named_sharding(_AXES[name], shape, mesh, rules)
          for name, shape in shapes(cfg, batch, length, key_layout).items()}


def pad_slots(cache: dict, extra: int) -> dict:
  """A contiguous cache (stacked or one layer's) with `extra` zero slots after its last."""
  def pad(name, x):
    widths = [(0, 0)] * x.ndim
    widths[x.ndim + _slot_axis(name)] = (0, extra)
    return jnp.pad(x, widths)
  return {name: pad(name, x) for name, x in cache.items()}


# Page pool layouts by key layout (the names tell them apart): slot-minor as the contiguous
# cache's; slot-major token-major, [L, NP, Q, K, Dh] for keys and values alike (a token's
# heads contiguous, as in the Pallas TPU kernels' pages): a slot's write is then one
# contiguous row, and XLA:TPU keeps the pool in the layout the gathers read; with
# [NP, K, Q, Dh] it laid the pool out for the writes and relayouted all of it for the
# gathers every decode step (8.9 GB per step and chip for the Qwen3-1.7B recipe).
PAGE_LAYOUTS = {"slot_minor": ("pages_k", "pages_v"),
                "slot_major": ("token_pages_k", "token_pages_v")}
_PAGE_AXES = {"pages_k": (sh.KV_HEADS, sh.HEAD_DIM, None),  # after [L, NP]
              "pages_v": (sh.KV_HEADS, None, sh.HEAD_DIM),
              "token_pages_k": (None, sh.KV_HEADS, sh.HEAD_DIM),
              "token_pages_v": (None, sh.KV_HEADS, sh.HEAD_DIM)}


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
    pool: the stacked page pool, for a layer scan to read in place, or None (each layer's
      cache holds its pages). Here it reaches every layer whole (the index is broadcast to
      the scanned layers), and the scanned cache is `pool_layers`, each layer's number:
      scanned as the cache, each layer's pages would be sliced out of the pool, and
      XLA:TPU copies such a slice when it goes into the read's `lax.switch` (34 of the
      49.7 GB of HBM traffic per decode step and chip of the Qwen3-1.7B recipe's
      continuous sampler, `launch.compile`; with token-major pages too, 8.4 GB in all).
  """
  block_table: jax.Array
  read_branch: jax.Array
  read_pages: tuple[int, ...] = struct.field(pytree_node=False, default=())
  groups: tuple[tuple[int, int], ...] = struct.field(pytree_node=False, default=())
  pool: dict | None = None


def pool_layers(num_layers: int) -> dict:
  """The cache a layer scan takes beside a `PagedIndex` holding the pool."""
  return {"layer": jnp.arange(num_layers, dtype=jnp.int32)}


def page_layout(pool: dict) -> str:
  """A page pool's key layout (`PAGE_LAYOUTS`; a dict of buffers or of their shapes)."""
  return "slot_major" if "token_pages_k" in pool else "slot_minor"


def page_names(pool: dict) -> tuple[str, str]:
  """The names of a page pool's keys and values (`PAGE_LAYOUTS`)."""
  return PAGE_LAYOUTS[page_layout(pool)]


def page_shapes(cfg: ModelConfig, num_pages: int, page_size: int,
                key_layout: str = "slot_minor") -> dict[str, tuple[int, ...]]:
  """Shapes of a stacked page pool: slot-minor keys [L, NP, K, Dh, Q] and values
  [L, NP, K, Q, Dh], or slot-major (token-major) both [L, NP, Q, K, Dh]."""
  L, K, Dh, NP, Q = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, num_pages, page_size
  k, v = PAGE_LAYOUTS[key_layout]
  if key_layout == "slot_minor":
    return {k: (L, NP, K, Dh, Q), v: (L, NP, K, Q, Dh)}
  return {k: (L, NP, Q, K, Dh), v: (L, NP, Q, K, Dh)}


def init_pages(cfg: ModelConfig, num_pages: int, page_size: int, dtype=None,
               key_layout: str = "slot_minor") -> dict:
  """Zeros for a stacked page pool (dtype: the compute dtype)."""
  dtype = dtype or cfg.jnp_dtype
  return {name: jnp.zeros(shape, dtype)
          for name, shape in page_shapes(cfg, num_pages, page_size, key_layout).items()}


def page_shardings(cfg: ModelConfig, num_pages: int, page_size: int, mesh, rules,
                   sharded: bool = False, key_layout: str = "slot_minor") -> dict:
  """NamedShardings of a stacked page pool on `mesh`: KV heads over `tensor`, and with
  `sharded` the pages over the batch axes (one part of the pool per data shard's engine)."""
  lead = (sh.LAYERS, sh.BATCH if sharded else None)
  return {name: sh.named_sharding(lead + _PAGE_AXES[name], shape, mesh, rules)
          for name, shape in page_shapes(cfg, num_pages, page_size, key_layout).items()}


def as_pages(cache, page_size: int):
  """A contiguous cache of P rows x S slots (S a multiple of Q) as P * S/Q pages, row-major
  (row p's slots [j*Q, (j+1)*Q) become page p * S/Q + j), in the pages of its key layout."""
  if isinstance(cache, tuple):
    return tuple(as_pages(layer, page_size) for layer in cache)
  name = key_name(cache)
  k, v = cache[name], cache["v"]  # [..., P, K, Dh, S] or [..., P, K, S, Dh]; [..., P, K, S, Dh]
  *lead, P, K, S, Dh = v.shape
  n, Q, m = S // page_size, page_size, len(lead)
  to_pages = lambda x_PKnQd: jnp.moveaxis(x_PKnQd, m + 2, m + 1).reshape(*lead, P * n, K, Q, Dh)
  v_NKQd = to_pages(v.reshape(*lead, P, K, n, Q, Dh))
  if name == "k":  # slot-minor: keys [NP, K, Dh, Q], values [NP, K, Q, Dh]
    k = jnp.moveaxis(k.reshape(*lead, P, K, Dh, n, Q), m + 3, m + 1)
    return dict(zip(PAGE_LAYOUTS["slot_minor"], (k.reshape(*lead, P * n, K, Dh, Q), v_NKQd)))
  k_NKQd = to_pages(k.reshape(*lead, P, K, n, Q, Dh))  # token-major: [NP, Q, K, Dh]
  return dict(zip(PAGE_LAYOUTS["slot_major"], (jnp.swapaxes(k_NKQd, -2, -3),
                                                jnp.swapaxes(v_NKQd, -2, -3))))


def from_pages(pages, rows: int):
  """`as_pages`' inverse: pages (those of `rows` rows, row-major) as a contiguous cache of
  `rows` rows x (pages per row * Q) slots, in its key layout's buffers."""
  if isinstance(pages, tuple):
    return tuple(from_pages(layer, rows) for layer in pages)
  names = PAGE_LAYOUTS[page_layout(pages)]
  k, v = pages[names[0]], pages[names[1]]
  m = k.ndim - 4
  *lead, N = k.shape[:m + 1]
  n = N // rows

  def dense(x, token_axis):  # [..., N, a, b, c] with the page's tokens at `token_axis`
    x = x.reshape(*lead, rows, n, *x.shape[m + 1:])          # [..., P, n, a, b, c]
    x = jnp.moveaxis(x, m + 1, m + 1 + token_axis)            # n just before the tokens
    shape = x.shape
    at = m + 1 + token_axis
    return x.reshape(*shape[:at], shape[at] * shape[at + 1], *shape[at + 2:])

  if names[0] == "pages_k":  # keys [N, K, Dh, Q], values [N, K, Q, Dh]
    return {"k": dense(k, 2), "v": dense(v, 1)}
  # token-major: [N, Q, K, Dh] -> [P, K, S, Dh]
  to_heads = lambda x: jnp.swapaxes(x, m + 1, m + 2)  # [N, K, Q, Dh]
  return {"k_sd": dense(to_heads(k), 1), "v": dense(to_heads(v), 1)}


def put_pages(pool, pages, first: int = 0):
  """`pool` with `pages` (as made by `as_pages`) written at page ids [first, first + n)."""
  if isinstance(pool, tuple):
    return tuple(put_pages(a, b, first) for a, b in zip(pool, pages))
  at = lambda x: (0,) * (x.ndim - 4) + (first, 0, 0, 0)
  return {name: jax.lax.dynamic_update_slice(x, pages[name].astype(x.dtype), at(x))
          for name, x in pool.items()}


def write_pages(pool, k_new: jax.Array, v_new: jax.Array, page, offset):
  """`pool` (stacked [L, ...], or one dict per layer) with each slot's new key and value
  ([L, M, K, 1, Dh], or one pair per layer) written at its page and offset ([M])."""
  if isinstance(pool, tuple):
    return tuple(write_pages(layer, k, v, page, offset)
                 for layer, k, v in zip(pool, k_new, v_new))
  if k_new.ndim == 5:  # stacked over layers
    return jax.vmap(write_pages, in_axes=(0, 0, 0, None, None))(pool, k_new, v_new, page, offset)
  k, v = page_names(pool)
  k_MKd, v_MKd = k_new[:, :, 0].astype(pool[k].dtype), v_new[:, :, 0].astype(pool[v].dtype)
  if k == "pages_k":  # [NP, K, Dh, Q], [NP, K, Q, Dh]
    return {k: pool[k].at[page, :, :, offset].set(k_MKd),
            v: pool[v].at[page, :, offset, :].set(v_MKd)}
  return {k: pool[k].at[page, offset].set(k_MKd), v: pool[v].at[page, offset].set(v_MKd)}


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
  return dict(cache, **{"prefix_" + name: x for name, x in prefix_cache.items()})


def own_part(cache):
  """The rows' own buffers of a cache, without any shared prefix (what the sampler donates)."""
  if isinstance(cache, tuple):
    return tuple(own_part(layer) for layer in cache)
  return {name: cache[name] for name in (key_name(cache), "v")}


def _prefix_len(cache: dict) -> int:
  return cache["prefix_v"].shape[-2] if "prefix_v" in cache else 0


def write(cache: dict, k_new: jax.Array, v_new: jax.Array, cache_index) -> dict:
  """Writes T new keys and values [..., B, K, T, Dh] at slots [cache_index, cache_index + T).

  The leading dims are the cache's: [L] for a stacked cache (all layers at once, after the
  scan), none for one layer's buffers. Kept beside instead, for attention to read and the
  caller to write afterwards: a paged cache's (`PagedIndex` as `cache_index`; its pages stay
  as they are: a decode step may run under a `lax.switch`, which would copy a pool it
  wrote; `pending`, `write_pages`), and one layer's single new token in a slot-major cache
  (the stacked write after the layer scan, or `commit`, stores it; module docstring).
  """
  if isinstance(cache_index, PagedIndex):  # kept beside the pages, written by `write_pages`
    if k_new.shape[-2] != 1:
      raise ValueError(f"a paged cache takes one new token per slot, got {k_new.shape[-2]}")
    return dict(cache, new_k=k_new, new_v=v_new)
  if key_name(cache) == "k_sd" and k_new.ndim == 4 and k_new.shape[-2] == 1:
    return dict(cache, new_k=k_new, new_v=v_new)
  return store(cache, k_new, v_new, cache_index)


def store(cache: dict, k_new: jax.Array, v_new: jax.Array, cache_index) -> dict:
  """`write`, always into the buffers (the caller's slices of them are then copies)."""
  index = cache_index - _prefix_len(cache)  # prefix slots are never written
  lead = (0,) * (k_new.ndim - 2)
  name = key_name(cache)
  if name == "k":  # keys are stored [Dh, S]
    k_new, k_at = jnp.swapaxes(k_new, -1, -2), lead + (0, index)
  else:
    k_at = lead + (index, 0)
  return dict(cache, **{
      name: jax.lax.dynamic_update_slice(cache[name], k_new.astype(cache[name].dtype), k_at),
      "v": jax.lax.dynamic_update_slice(cache["v"], v_new.astype(cache["v"].dtype),
                                        lead + (index, 0))})


def commit(cache: dict, cache_index) -> dict:
  """One layer's contiguous cache with the token `write` kept beside it stored at
  `cache_index` (as it is, if none; a paged cache's are the caller's: `write_pages`)."""
  if "new_k" not in cache or "v" not in cache:
    return cache
  rest = {name: x for name, x in cache.items() if name not in ("new_k", "new_v")}
  return store(rest, cache["new_k"], cache["new_v"], cache_index)


def _own(layer: dict, name: str, cache_index) -> jax.Array:
  """The rows' own keys or values (`name`) of one layer, with a kept-beside new token
  selected in at its slot (`write`): what a stored cache would hold, never written."""
  x = layer[name]
  if "new_k" not in layer:
    return x
  new = layer["new_v" if name == "v" else "new_k"]  # [B, K, 1, Dh], x: [B, K, S, Dh]
  at_S1 = (jnp.arange(x.shape[-2]) == cache_index - _prefix_len(layer))[:, None]
  return jnp.where(at_S1, new.astype(x.dtype), x)


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


# q . k of the rows' own keys and of a shared prefix's, by key layout.
_SCORE_EQNS = {"k": ("BKGTd,BKdS->BKGTS", "PKQd,PKdS->PKQS"),
               "k_sd": ("BKGTd,BKSd->BKGTS", "PKQd,PKSd->PKQS")}


def scores(layer: dict, q_BKGTd: jax.Array, cache_index=0) -> jax.Array:
  """Float32 q . k [B, K, G, T, S] over all slots (prefix first) of one layer's cache
  (`cache_index`: where `write` would have put a new token kept beside)."""
  dt, name = q_BKGTd.dtype, key_name(layer)
  own_eqn, prefix_eqn = _SCORE_EQNS[name]
  own_BKGTS = jnp.einsum(own_eqn, q_BKGTd, _own(layer, name, cache_index).astype(dt),
                         preferred_element_type=jnp.float32)
  if "prefix_v" not in layer:
    return own_BKGTS
  prefix_k = layer["prefix_" + name]
  q_PKQd = _by_prompt(q_BKGTd, prefix_k.shape[0])
  pre_PKQS = jnp.einsum(prefix_eqn, q_PKQd, prefix_k.astype(dt),
                        preferred_element_type=jnp.float32)
  _, _, G, T, _ = q_BKGTd.shape
  return jnp.concatenate([_by_row(pre_PKQS, G, T), own_BKGTS], axis=-1)


def mix(layer: dict, probs_BKGTS: jax.Array, cache_index=0) -> jax.Array:
  """Attention output [B, K, G, T, Dh]: the values weighted by `probs` (slots as in `scores`)."""
  dt = probs_BKGTS.dtype
  S0 = _prefix_len(layer)
  out_BKGTd = jnp.einsum("BKGTS,BKSd->BKGTd", probs_BKGTS[..., S0:],
                         _own(layer, "v", cache_index).astype(dt))
  if not S0:
    return out_BKGTd
  prefix_v = layer["prefix_v"]
  _, _, G, T, _ = probs_BKGTS.shape
  probs_PKQS = _by_prompt(probs_BKGTS[..., :S0], prefix_v.shape[0])
  pre_PKQd = jnp.einsum("PKQS,PKSd->PKQd", probs_PKQS, prefix_v.astype(dt))
  return out_BKGTd + _by_row(pre_PKQd, G, T)
