"""Attention kernels: causal self-attention (training, prefill) and attention over a KV cache.

Shapes use the model's letters: queries `q_BTKGd` (the G query heads of each of the K kv
heads, H = K * G), keys and values `k_BSKd`, `v_BSKd`, and `valid_BS`, 1 where a key slot
holds a real token. A query at position i sees key j iff j <= i and `valid[b, j]`; a query
that sees no key at all (left padding) gets uniform weights instead of NaN, as in the
transformers models we match. Scores and the softmax are float32; the products with the
values run in the compute dtype.

`causal_attention` has four implementations of the same function (`ModelConfig.attention`):
  xla:       the whole float32 score tensor [B, K, G, T, S] at once: fastest for short
             sequences, and what `blockwise` and the fused kernels are tested against;
  blockwise: flash-style in plain JAX, on every platform: key blocks of `BLOCK` slots with
             an online softmax, and a custom VJP that recomputes each block's scores from
             the saved log-sum-exp, so neither pass holds more than [B, K, G, T, BLOCK];
  cudnn:     `jax.nn.dot_product_attention(implementation='cudnn')`, cuDNN's fused flash
             attention on NVIDIA GPUs (bf16/fp16);
  splash:    the Pallas splash-attention kernel on TPU, per device under `shard_map`; with
             a context axis each device computes its own block of queries' rows against
             the gathered keys and values.
'auto' takes cudnn where `cudnn_unsupported` finds nothing against it (an NVIDIA GPU,
bf16/fp16, a head dim cuDNN takes), splash on a TPU, and xla on a CPU while the sequence
fits one block; otherwise blockwise. Asked for by name, cudnn refuses what it cannot run.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import platform
from jaxrl_llm import sharding as sh

# Finite, so a query whose keys are all masked (a padding query) gets uniform weights, not NaN.
MASKED = -0.7 * float(np.finfo(np.float32).max)
BLOCK = 512  # key slots per block of the blockwise kernel


def cudnn_unsupported(dtype, head_dim: int, length: int, where: str,
                      capability: tuple[int, int] | None = None) -> str | None:
  """Why cuDNN's fused attention cannot run these queries (None: it can).

  What `jax.nn.dot_product_attention(implementation='cudnn')` accepts here: an NVIDIA GPU
  (`where` 'gpu'), bf16 or fp16, a head dim that is a multiple of 8 up to 128 (256 from
  compute `capability` 9.0, Hopper), and, since the padding mask reaches cuDNN as a bias
  whose gradient it computes only then, an even sequence `length`.
  """
  if where != "gpu":
    return f"cuDNN runs on NVIDIA GPUs, not on {where}"
  if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    return f"cuDNN's fused attention takes bf16 or fp16, not {jnp.dtype(dtype).name}"
  largest = 256 if (capability or (0, 0)) >= (9, 0) else 128
  if head_dim % 8 or head_dim > largest:
    return (f"cuDNN's fused attention takes a head dim that is a multiple of 8 up to "
            f"{largest}, not {head_dim}")
  if length % 2:
    return f"cuDNN's fused attention with a padding mask takes an even length, not {length}"
  return None


def resolve(impl: str, *, where: str, dtype, head_dim: int, length: int,
            capability: tuple[int, int] | None = None, block: int = BLOCK,
            seq_shards: int = 1) -> str:
  """The implementation 'auto' stands for on platform `where` ('cpu', 'gpu', 'tpu'); a
  named one is returned as it is, once checked. `seq_shards`: the context pieces the
  sequence is cut into (splash takes a multiple of 128 tokens per piece)."""
  why_not_cudnn = cudnn_unsupported(dtype, head_dim, length, where, capability)
  if impl == "cudnn" and why_not_cudnn:
    raise ValueError(f"attention='cudnn': {why_not_cudnn}; expected 'auto', 'xla' or "
                     "'blockwise'")
  if impl != "auto":
    return impl
  if why_not_cudnn is None:
    return "cudnn"
  if where == "tpu" and length % (128 * seq_shards) == 0:
    return "splash"
  return "xla" if length <= block else "blockwise"


def sequence_multiple(mesh, rules) -> int:
  """What a sequence split over the context devices is padded to a multiple of: the pieces
  the 'seq' rule cuts it into (`sh.seq_shards`), on a TPU each of whole 128-token blocks,
  so that 'auto' runs splash attention per piece rather than blockwise."""
  c = sh.seq_shards(mesh, rules)
  return c * 128 if c > 1 and platform.of(mesh) == "tpu" else c


def _context_pieces(T: int, mesh, rules) -> int:
  """The pieces a T-token sequence is cut into over the context devices: the 'seq' rule's
  (`sh.seq_shards`), or 1 for a length it does not divide (it stays whole on each device,
  as `sh.logical_to_spec` places it)."""
  c = sh.seq_shards(mesh, rules)
  return c if T % c == 0 else 1


def causal_attention(q_BTKGd, k_BTKd, v_BTKd, valid_BT, *, impl: str = "auto", mesh=None,
                     rules=None, block: int = BLOCK):
  """Causal grouped-query self-attention of T tokens; returns [B, T, K, G, d] (q's dtype).

  Args:
    q_BTKGd, k_BTKd, v_BTKd: queries, keys and values (after RoPE).
    valid_BT: int/bool, 1 on real tokens; padding keys are never attended to.
    impl: one of `ModelConfig.attention`'s values.
    mesh, rules: where the arrays live (the splash kernel runs per device).
    block: key slots per block of the blockwise kernel.
  """
  T, dt, d = q_BTKGd.shape[1], q_BTKGd.dtype, q_BTKGd.shape[-1]
  impl = resolve(impl, where=platform.of(mesh), capability=platform.compute_capability(mesh),
                 dtype=dt, head_dim=d, length=T, block=block,
                 seq_shards=_context_pieces(T, mesh, rules))
  if impl == "xla":
    return _xla(q_BTKGd, k_BTKd, v_BTKd, valid_BT)
  if impl == "blockwise":
    return _blockwise(q_BTKGd, k_BTKd, v_BTKd, valid_BT.astype(bool), block)
  if impl == "cudnn":
    return _cudnn(q_BTKGd, k_BTKd, v_BTKd, valid_BT)
  if impl == "splash":
    return _splash(q_BTKGd, k_BTKd, v_BTKd, valid_BT, mesh, rules)
  raise ValueError(f"attention={impl!r}: expected one of auto, xla, blockwise, cudnn, splash")


def _causal_mask(valid_BS, T: int, S: int, q_offset=0, k_offset=0):
  """[B, T, S] bool: query slot q_offset + i sees key slot k_offset + j."""
  q_T = q_offset + jnp.arange(T)
  k_S = k_offset + jnp.arange(S)
  return (k_S[None, :] <= q_T[:, None])[None] & valid_BS[:, None, :].astype(bool)


# --- xla: the whole score tensor ----------------------------------------------------------------
def _xla(q_BTKGd, k_BSKd, v_BSKd, valid_BS):
  B, T, K, G, d = q_BTKGd.shape
  S = k_BSKd.shape[1]
  q_BKGTd = q_BTKGd.transpose(0, 2, 3, 1, 4)
  s_BKGTS = jnp.einsum("BKGTd,BKSd->BKGTS", q_BKGTd, k_BSKd.transpose(0, 2, 1, 3),
                       preferred_element_type=jnp.float32)
  mask_BTS = _causal_mask(valid_BS, T, S)
  s_BKGTS = jnp.where(mask_BTS[:, None, None], s_BKGTS * d ** -0.5, MASKED)
  p_BKGTS = jax.nn.softmax(s_BKGTS, axis=-1).astype(q_BTKGd.dtype)  # softmax in float32
  out_BKGTd = jnp.einsum("BKGTS,BKSd->BKGTd", p_BKGTS, v_BSKd.transpose(0, 2, 1, 3))
  return out_BKGTd.transpose(0, 3, 1, 2, 4)


# --- blockwise: online softmax over key blocks, recomputing backward ------------------------------
def _blockwise(q_BTKGd, k_BSKd, v_BSKd, valid_BS, block: int):
  out_BKGTd = _flash(q_BTKGd.transpose(0, 2, 3, 1, 4), k_BSKd.transpose(0, 2, 1, 3),
                     v_BSKd.transpose(0, 2, 1, 3), valid_BS, block)
  return out_BKGTd.transpose(0, 3, 1, 2, 4)


def _key_blocks(k_BKSd, v_BKSd, valid_BS, C: int):
  """Keys, values and validity cut into n blocks of C slots: [n, B, K, C, d], [n, B, C].

  Slots past S (padding of the last block) are marked -1 in the validity: never attended.
  """
  B, K, S, d = k_BKSd.shape
  n = -(-S // C)
  pad = n * C - S
  to_blocks = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(
      B, K, n, C, d).transpose(2, 0, 1, 3, 4)
  valid = jnp.pad(valid_BS.astype(jnp.int32), ((0, 0), (0, pad)), constant_values=-1)
  return to_blocks(k_BKSd), to_blocks(v_BKSd), valid.reshape(B, n, C).transpose(1, 0, 2)


def _block_scores(q_BKGTd, k_BKCd, valid_BC, start):
  """Scaled, masked float32 scores of one key block: [B, K, G, T, C].

  Masked keys score MASKED (a fully masked query row stays uniform, as in `_xla`); slots past
  the sequence score -inf (they take no weight at all).
  """
  T, d = q_BKGTd.shape[-2:]
  C = k_BKCd.shape[2]
  s = jnp.einsum("BKGTd,BKCd->BKGTC", q_BKGTd, k_BKCd, preferred_element_type=jnp.float32)
  mask_BTC = _causal_mask(valid_BC > 0, T, C, 0, start)
  s = jnp.where(mask_BTC[:, None, None], s * d ** -0.5, MASKED)
  return jnp.where((valid_BC >= 0)[:, None, None, None, :], s, -jnp.inf)


def _flash_forward(q_BKGTd, k_BKSd, v_BKSd, valid_BS, C: int):
  """(out [B, K, G, T, d] in q's dtype, log-sum-exp [B, K, G, T] float32)."""
  B, K, G, T, d = q_BKGTd.shape
  k_n, v_n, valid_n = _key_blocks(k_BKSd, v_BKSd, valid_BS, C)
  starts = jnp.arange(k_n.shape[0]) * C

  def body(carry, blk):
    m_BKGT, l_BKGT, acc_BKGTd = carry
    k_BKCd, v_BKCd, valid_BC, start = blk
    s = _block_scores(q_BKGTd, k_BKCd, valid_BC, start)
    m_new = jnp.maximum(m_BKGT, s.max(axis=-1))
    p = jnp.exp(s - m_new[..., None])
    rescale = jnp.exp(m_BKGT - m_new)
    l_new = l_BKGT * rescale + p.sum(axis=-1)
    pv = jnp.einsum("BKGTC,BKCd->BKGTd", p.astype(q_BKGTd.dtype), v_BKCd,
                    preferred_element_type=jnp.float32)
    return (m_new, l_new, acc_BKGTd * rescale[..., None] + pv), None

  init = (jnp.full((B, K, G, T), -jnp.inf, jnp.float32), jnp.zeros((B, K, G, T), jnp.float32),
          jnp.zeros((B, K, G, T, d), jnp.float32))
  (m, l, acc), _ = jax.lax.scan(body, init, (k_n, v_n, valid_n, starts))
  return (acc / l[..., None]).astype(q_BKGTd.dtype), m + jnp.log(l)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q_BKGTd, k_BKSd, v_BKSd, valid_BS, C):
  return _flash_forward(q_BKGTd, k_BKSd, v_BKSd, valid_BS, C)[0]


def _flash_fwd(q_BKGTd, k_BKSd, v_BKSd, valid_BS, C):
  out, lse = _flash_forward(q_BKGTd, k_BKSd, v_BKSd, valid_BS, C)
  return out, (q_BKGTd, k_BKSd, v_BKSd, valid_BS, out, lse)


def _flash_bwd(C, residuals, dout_BKGTd):
  q_BKGTd, k_BKSd, v_BKSd, valid_BS, out, lse_BKGT = residuals
  S, d, dt = k_BKSd.shape[2], q_BKGTd.shape[-1], q_BKGTd.dtype
  k_n, v_n, valid_n = _key_blocks(k_BKSd, v_BKSd, valid_BS, C)
  starts = jnp.arange(k_n.shape[0]) * C
  dout = dout_BKGTd.astype(dt)
  delta_BKGT = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)

  def body(dq_BKGTd, blk):
    k_BKCd, v_BKCd, valid_BC, start = blk
    s = _block_scores(q_BKGTd, k_BKCd, valid_BC, start)
    p = jnp.exp(s - lse_BKGT[..., None])  # this block's softmax weights
    dv_BKCd = jnp.einsum("BKGTC,BKGTd->BKCd", p.astype(dt), dout,
                         preferred_element_type=jnp.float32)
    dp = jnp.einsum("BKGTd,BKCd->BKGTC", dout, v_BKCd, preferred_element_type=jnp.float32)
    # Masked scores are constants (MASKED): no gradient flows through them.
    live = (s > MASKED) & (s > -jnp.inf)
    ds = jnp.where(live, p * (dp - delta_BKGT[..., None]), 0.0) * d ** -0.5
    dq_BKGTd = dq_BKGTd + jnp.einsum("BKGTC,BKCd->BKGTd", ds.astype(dt), k_BKCd,
                                     preferred_element_type=jnp.float32)
    dk_BKCd = jnp.einsum("BKGTC,BKGTd->BKCd", ds.astype(dt), q_BKGTd,
                         preferred_element_type=jnp.float32)
    return dq_BKGTd, (dk_BKCd, dv_BKCd)

  dq, (dk_n, dv_n) = jax.lax.scan(body, jnp.zeros(q_BKGTd.shape, jnp.float32),
                                  (k_n, v_n, valid_n, starts))
  from_blocks = lambda x_n: x_n.transpose(1, 2, 0, 3, 4).reshape(
      x_n.shape[1], x_n.shape[2], -1, x_n.shape[-1])[:, :, :S]
  return (dq.astype(dt), from_blocks(dk_n).astype(k_BKSd.dtype),
          from_blocks(dv_n).astype(v_BKSd.dtype), None)


_flash.defvjp(_flash_fwd, _flash_bwd)


# --- cudnn: NVIDIA's fused flash attention --------------------------------------------------------
def _cudnn(q_BTKGd, k_BSKd, v_BSKd, valid_BS, implementation: str = "cudnn"):
  """cuDNN's kernel through `jax.nn.dot_product_attention` (`implementation` 'xla' runs the
  same call on any platform: the tests check the arguments that way)."""
  B, T, K, G, d = q_BTKGd.shape
  # is_causal lets cuDNN skip the blocks above the diagonal; the mask adds the key padding
  # (left-padded prompts), which cuDNN's length-based padding cannot express.
  mask_B1TS = _causal_mask(valid_BS, T, k_BSKd.shape[1])[:, None]
  out_BTHd = jax.nn.dot_product_attention(q_BTKGd.reshape(B, T, K * G, d), k_BSKd, v_BSKd,
                                          mask=mask_B1TS, is_causal=True,
                                          implementation=implementation)
  return out_BTHd.reshape(B, T, K, G, d)


# --- splash: the Pallas TPU kernel, per device ----------------------------------------------------
def _splash(q_BTKGd, k_BSKd, v_BSKd, valid_BS, mesh, rules):
  """Splash attention per device under `shard_map`. With a context axis (the 'seq' rule
  cutting the sequence into c pieces), each device keeps its own c-th of the queries and
  gathers the keys and values: the kernel's mask is the whole causal mask cut into c row
  blocks (`q_seq_shards`), so a device computes its queries' rows only."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
  B, T, K, G, d = q_BTKGd.shape
  c = _context_pieces(T, mesh, rules)
  if (T // c) % 128:
    raise ValueError(f"attention='splash' needs a sequence length that is a multiple of 128 "
                     f"per context shard (x{c}), got {T}; use 'auto' or 'blockwise'")
  blk = math.gcd(T // c, 512)
  sizes = splash.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                            block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk,
                            block_kv_dq=blk)
  kernel = splash.make_splash_mqa(
      masks.MultiHeadMask([masks.CausalMask((T, T)) for _ in range(G)]), block_sizes=sizes,
      head_shards=1, q_seq_shards=c, interpret=platform.of(mesh) != "tpu")  # CPU: interpreted

  def one_device(kernel, q_BtKGd, k_BSKd, v_BSKd, valid_Bt, valid_BS):
    # Real tokens are segment 1, padding segment 0: a real query never sees a padding key,
    # and every query sees at least itself. Padding queries' outputs are never read.
    q_BKGtd = (q_BtKGd * d ** -0.5).astype(q_BtKGd.dtype).transpose(0, 2, 3, 1, 4)
    k_BKSd, v_BKSd = k_BSKd.transpose(0, 2, 1, 3), v_BSKd.transpose(0, 2, 1, 3)
    segments = lambda q_t, kv_S: splash.SegmentIds(q_t.astype(jnp.int32), kv_S.astype(jnp.int32))
    per_head = jax.vmap(lambda q, k, v, q_t, kv_S: kernel(q, k, v, segments(q_t, kv_S)),
                        in_axes=(0, 0, 0, None, None))  # over the K kv heads (MQA in a group)
    out_BKGtd = jax.vmap(per_head)(q_BKGtd, k_BKSd, v_BKSd, valid_Bt, valid_BS)
    return out_BKGtd.transpose(0, 3, 1, 2, 4).astype(q_BtKGd.dtype)

  if mesh is None or rules is None:
    return one_device(kernel, q_BTKGd, k_BSKd, v_BSKd, valid_BS, valid_BS)
  spec = lambda names, x: sh.logical_to_spec(names, x.shape, mesh, rules)
  q_spec = spec((sh.BATCH, sh.SEQ, sh.KV_HEADS, None, None), q_BTKGd)
  kv_spec = spec((sh.BATCH, None, sh.KV_HEADS, None), k_BSKd)  # gathered along the sequence
  kernel_spec = kernel.manual_sharding_spec(jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(None, q_spec[1])))  # the mask's rows as the queries'
  return jax.shard_map(
      one_device, mesh=mesh, in_specs=(kernel_spec, q_spec, kv_spec, kv_spec,
                                       spec((sh.BATCH, sh.SEQ), valid_BS),
                                       spec((sh.BATCH, None), valid_BS)),
      out_specs=q_spec, check_vma=False)(kernel, q_BTKGd, k_BSKd, v_BSKd, valid_BS, valid_BS)


# --- attention over a KV cache (decoding) ----------------------------------------------------------
def cache_attention(q_BTKGd, layer_cache: dict, valid_BS, cache_index):
  """T new tokens, already written to the cache at slots [cache_index, cache_index + T),
  attending to every earlier slot and to themselves.

  Args:
    q_BTKGd: the new tokens' queries.
    layer_cache: one layer of `kv_cache` (own slots, maybe a shared prefix; or pages).
    valid_BS: validity of every slot (prefix first; for pages, of every block-table slot).
    cache_index: the slot of the first new token (for pages, a `kv_cache.PagedIndex`).
  Returns:
    [B, T, K, G, d].
  """
  from jaxrl_llm.models import kv_cache  # pylint: disable=g-import-not-at-top
  if isinstance(cache_index, kv_cache.PagedIndex):
    return paged_attention(q_BTKGd, layer_cache, valid_BS, cache_index)
  B, T, K, G, d = q_BTKGd.shape
  s_BKGTS = kv_cache.scores(layer_cache, q_BTKGd.transpose(0, 2, 3, 1, 4), cache_index)
  mask_BTS = _causal_mask(valid_BS, T, s_BKGTS.shape[-1], q_offset=cache_index)
  s_BKGTS = jnp.where(mask_BTS[:, None, None], s_BKGTS * d ** -0.5, MASKED)
  p_BKGTS = jax.nn.softmax(s_BKGTS, axis=-1).astype(q_BTKGd.dtype)  # softmax in float32
  return kv_cache.mix(layer_cache, p_BKGTS, cache_index).transpose(0, 3, 1, 2, 4)


def paged_attention(q_BTKGd, layer_cache: dict, valid_BS, index):
  """One new token per slot attending to its sequence in a paged cache (`kv_cache`): the
  pages of its block table and the token's own key and value (`new_k`, `new_v` of the
  layer cache, not yet in the pages).

  Each group of slots (`index.groups`) reads the first `index.read_pages[branch]` pages of
  its slots' block tables, a plain gather: every branch of the switch has its own static
  size, so a group reads about its longest live sequence, not the table's full length.
  The pages are the layer cache's, or this layer's of the stacked pool in `index.pool`
  (the layer cache then holds its 'layer'). `valid_BS` marks the earlier tokens in the
  table's pages, [B, PP * Q]. Returns [B, 1, K, G, d].
  """
  from jaxrl_llm.models import kv_cache  # pylint: disable=g-import-not-at-top
  B, T, K, G, d = q_BTKGd.shape
  if T != 1:
    raise ValueError(f"paged attention decodes one token per slot, got {T}")
  dt = q_BTKGd.dtype
  pages, layer = (index.pool, layer_cache["layer"]) if "layer" in layer_cache else (
      layer_cache, None)
  k_name, v_name = kv_cache.page_names(pages)
  token_major = kv_cache.page_layout(pages) == "slot_major"  # else [NP, K, Dh|Q, Q|Dh]
  Q = pages[v_name].shape[-3 if token_major else -2]
  k_eqn, v_eqn = (("bKGd,bnQKd->bKGnQ", "bKGnQ,bnQKd->bKGd") if token_major else
                  ("bKGd,bnKdQ->bKGnQ", "bKGnQ,bnKQd->bKGd"))

  def read(n: int):
    def attend(q_bKGd, pages_k, pages_v, layer, table_bP, valid_bS, k_bKd, v_bKd):
      b = q_bKGd.shape[0]
      at = table_bP[:, :n] if layer is None else (layer, table_bP[:, :n])
      k_pages, v_pages = pages_k[at].astype(dt), pages_v[at].astype(dt)  # [b, n, ...]
      s_bKGnQ = jnp.einsum(k_eqn, q_bKGd, k_pages, preferred_element_type=jnp.float32)
      valid_b11nQ = valid_bS[:, :n * Q].reshape(b, 1, 1, n, Q) > 0
      s_bKGS = jnp.where(valid_b11nQ, s_bKGnQ * d ** -0.5, MASKED).reshape(b, K, G, n * Q)
      self_bKG1 = jnp.einsum("bKGd,bKd->bKG", q_bKGd, k_bKd.astype(dt),
                             preferred_element_type=jnp.float32)[..., None] * d ** -0.5
      p_bKGS = jax.nn.softmax(jnp.concatenate([s_bKGS, self_bKG1], axis=-1), axis=-1).astype(dt)
      out_bKGd = jnp.einsum(v_eqn, p_bKGS[..., :-1].reshape(b, K, G, n, Q), v_pages)
      return out_bKGd + p_bKGS[..., -1:] * v_bKd[:, :, None].astype(dt)
    return attend

  branches = [read(n) for n in index.read_pages]
  k_BKd, v_BKd = layer_cache["new_k"][:, :, 0], layer_cache["new_v"][:, :, 0]
  outs = [jax.lax.switch(index.read_branch[g], branches, q_BTKGd[lo:hi, 0],
                         pages[k_name], pages[v_name], layer,
                         index.block_table[lo:hi], valid_BS[lo:hi], k_BKd[lo:hi], v_BKd[lo:hi])
          for g, (lo, hi) in enumerate(index.groups)]
  return jnp.concatenate(outs, axis=0)[:, None]
