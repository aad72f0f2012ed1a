"""The decoder: Embed -> L x Block(RMSNorm, Attention, RMSNorm, Mlp) -> RMSNorm -> head.

One Flax module covers Llama 3, Qwen2 and Qwen3 (see `ModelConfig`). Layers are a Python
loop over separate blocks (`layers_0`, `layers_1`, ...), each with its own KV-cache buffer:
a decode step then updates every buffer in place and reads it where it lies. (A scan over
stacked layers copies each layer's cache slice in and out on every step, which made
decoding 3x slower on CPU.) Attention reads keys from S slots: the current tokens themselves
(S == T, no cache) or a preallocated KV cache written at `cache_index` (layouts, including
the sampler's shared prompt prefix, in `kv_cache`). A query at slot i sees key slot j iff j <= i and `kv_mask[b, j]`, so
left-padded prompts give the same values for their real tokens as unpadded ones.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_llm import sharding as sh
from jaxrl_llm.models import kv_cache, value_head
from jaxrl_llm.models.config import ModelConfig

_init = nn.initializers.normal(stddev=0.02)
# Finite, so a row whose keys are all masked (a padding query) gives uniform weights, not NaN.
_MASKED = -0.7 * float(np.finfo(np.float32).max)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies [Dh/2] of RoPE, with HF's `linear` and `llama3` rope scaling."""
  dim = cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
  params = cfg.rope_params
  kind = params.get("rope_type", "default")
  if kind == "linear":
    inv_freq = inv_freq / params["factor"]
  elif kind == "llama3":
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    inv_freq = np.where(medium, smoothed, scaled)
  return inv_freq.astype(np.float32)


def rope_tables(positions_BT: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, T, Dh] of position * inv_freq, the angles repeated for both halves."""
  freqs_BTf = positions_BT.astype(jnp.float32)[:, :, None] * inv_freq[None, None, :]  # [B, T, Dh/2]
  # The halves are repeated by a matmul with [I I], which is exact (one product by 1 per
  # output) and, unlike a concatenation, cannot be fused into the consumers: XLA would
  # otherwise recompute cos and sin per element of every rotated tensor in every layer, a
  # tenth of a CPU decode step. (An optimization_barrier does not stop that fusion on CPU.)
  half = inv_freq.shape[0]
  repeat_fd = np.concatenate([np.eye(half, dtype=np.float32)] * 2, axis=1)
  both_BTd = lambda table_BTf: jnp.einsum("BTf,fd->BTd", table_BTf, repeat_fd,
                                          precision=jax.lax.Precision.HIGHEST)
  return both_BTd(jnp.cos(freqs_BTf)), both_BTd(jnp.sin(freqs_BTf))


def apply_rope(x_BTNd: jax.Array, cos_BTd: jax.Array, sin_BTd: jax.Array) -> jax.Array:
  """Rotates pairs (d, d + Dh/2) by the tables' angles (HF's rotate_half layout)."""
  x = x_BTNd.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x * cos_BTd[:, :, None, :] + rotated * sin_BTd[:, :, None, :]).astype(x_BTNd.dtype)


def _lead(x: jax.Array, ndim: int) -> jax.Array:
  """Adds leading unit axes so x broadcasts against a rank-`ndim` array."""
  return x.reshape((1,) * (ndim - x.ndim) + x.shape)


class RMSNorm(nn.Module):
  """y = scale * x / sqrt(mean(x^2) + eps), the mean taken in float32."""
  eps: float
  dtype: Any
  param_dtype: Any
  axis_name: str = sh.EMBED

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                       (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return _lead(scale.astype(self.dtype), x.ndim) * y.astype(self.dtype)


class Linear(nn.Module):
  """y = einsum(eqn, x, kernel) (+ bias over the kernel's trailing `len(bias_axes)` dims)."""
  eqn: str
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_axes: tuple[str, ...] | None
  dtype: Any
  param_dtype: Any

  def setup(self):  # not compact: a parent may read `kernel` and `bias` without calling
    self.kernel = self.param("kernel", nn.with_logical_partitioning(_init, self.kernel_axes),
                             self.kernel_shape, self.param_dtype)
    self.bias = None
    if self.bias_axes is not None:
      shape = self.kernel_shape[len(self.kernel_shape) - len(self.bias_axes):]
      self.bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, self.bias_axes),
                             shape, self.param_dtype)

  def __call__(self, x):
    y = jnp.einsum(self.eqn, x.astype(self.dtype), self.kernel.astype(self.dtype))
    if self.bias is not None:
      y = y + _lead(self.bias.astype(self.dtype), y.ndim)
    return y


class Attention(nn.Module):
  """Grouped-query attention with RoPE, optional q/k norm and an optional KV cache."""
  cfg: ModelConfig
  mesh: Mesh | None = None
  rules: Any = None

  @nn.compact
  def __call__(self, x_BTD, rope, kv_mask_BS, cache, cache_index):
    cfg = self.cfg
    D, H, K, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dt, pdt = cfg.jnp_dtype, cfg.jnp_param_dtype
    G = H // K  # GQA: each of the K kv heads serves G query heads
    qkv_bias = lambda heads: (heads, sh.HEAD_DIM) if cfg.qkv_bias else None
    q = Linear("BTD,DHd->BTHd", (D, H, Dh), (sh.EMBED, sh.HEADS, sh.HEAD_DIM),
               qkv_bias(sh.HEADS), dt, pdt, name="q_proj")
    k = Linear("BTD,DKd->BTKd", (D, K, Dh), (sh.EMBED, sh.KV_HEADS, sh.HEAD_DIM),
               qkv_bias(sh.KV_HEADS), dt, pdt, name="k_proj")
    v = Linear("BTD,DKd->BTKd", (D, K, Dh), (sh.EMBED, sh.KV_HEADS, sh.HEAD_DIM),
               qkv_bias(sh.KV_HEADS), dt, pdt, name="v_proj")
    # One matmul for q, k and v (as for gate/up in `Mlp`): per kv head, its G query heads,
    # then its key and its value, so the kv-head axis keeps the tensor sharding.
    group = lambda w, n: jnp.concatenate([w(q).reshape(n + (K, G, Dh)), w(k)[..., None, :],
                                          w(v)[..., None, :]], axis=-2).astype(dt)
    B, T = x_BTD.shape[:2]
    qkv_BTKCd = jnp.einsum("BTD,DKCd->BTKCd", x_BTD.astype(dt), group(lambda m: m.kernel, (D,)))
    if cfg.qkv_bias:
      qkv_BTKCd = qkv_BTKCd + _lead(group(lambda m: m.bias, ()), 5)
    q_BTHd = qkv_BTKCd[:, :, :, :G].reshape(B, T, H, Dh)
    k_BTKd, v_BTKd = qkv_BTKCd[:, :, :, G], qkv_BTKCd[:, :, :, G + 1]
    if cfg.qk_norm:  # Qwen3: RMSNorm over head_dim, before RoPE
      q_BTHd = RMSNorm(cfg.rms_norm_eps, dt, pdt, sh.HEAD_DIM, name="q_norm")(q_BTHd)
      k_BTKd = RMSNorm(cfg.rms_norm_eps, dt, pdt, sh.HEAD_DIM, name="k_norm")(k_BTKd)
    q_BTHd = apply_rope(q_BTHd, *rope)
    k_BTKd = apply_rope(k_BTKd, *rope)

    k_BKTd, v_BKTd = k_BTKd.transpose(0, 2, 1, 3), v_BTKd.transpose(0, 2, 1, 3)
    # Both attention products are plain batched matmuls over (B, K).
    q_BKGTd = q_BTHd.reshape(B, T, K, G, Dh).transpose(0, 2, 3, 1, 4)
    if cache is None:  # keys are the current tokens: S == T
      new_cache = None
      scores_BKGTS = jnp.einsum("BKGTd,BKSd->BKGTS", q_BKGTd, k_BKTd,
                                preferred_element_type=jnp.float32)
    else:  # write this step's keys/values at slots [cache_index, cache_index + T), in place
      new_cache = kv_cache.update(cache, k_BKTd, v_BKTd, cache_index)
      scores_BKGTS = kv_cache.scores(new_cache, q_BKGTd)
    S = scores_BKGTS.shape[-1]
    q_slot_T = cache_index + jnp.arange(T)
    causal_TS = jnp.arange(S)[None, :] <= q_slot_T[:, None]
    mask_BTS = causal_TS[None, :, :] & kv_mask_BS[:, None, :].astype(bool)
    scores_BKGTS = jnp.where(mask_BTS[:, None, None], scores_BKGTS * Dh ** -0.5, _MASKED)
    probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(dt)  # softmax in float32
    if cache is None:
      out_BKGTd = jnp.einsum("BKGTS,BKSd->BKGTd", probs_BKGTS, v_BKTd)
    else:
      out_BKGTd = kv_cache.mix(new_cache, probs_BKGTS)
    out_BTHd = out_BKGTd.transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh)
    out_BTHd = sh.constrain(out_BTHd, (sh.BATCH, sh.SEQ, sh.HEADS, sh.HEAD_DIM), self.mesh, self.rules)
    o_bias = (sh.EMBED,) if cfg.o_bias else None
    out_BTD = Linear("BTHd,HdD->BTD", (H, Dh, D), (sh.HEADS, sh.HEAD_DIM, sh.EMBED), o_bias, dt, pdt,
                     name="o_proj")(out_BTHd)
    return out_BTD, new_cache


class Mlp(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.cfg
    D, F, dt, pdt = cfg.hidden_size, cfg.intermediate_size, cfg.jnp_dtype, cfg.jnp_param_dtype
    bias_in = (sh.MLP,) if cfg.mlp_bias else None
    gate = Linear("BTD,DF->BTF", (D, F), (sh.EMBED, sh.MLP), bias_in, dt, pdt, name="gate_proj")
    up = Linear("BTD,DF->BTF", (D, F), (sh.EMBED, sh.MLP), bias_in, dt, pdt, name="up_proj")
    # One matmul for both: a [D, 2F] kernel runs faster than two [D, F] ones when B*T is
    # small (decoding). Stacked on a new axis, not concatenated along F, so that F keeps its
    # sharding; inside the sampler's loop the stacking is loop-invariant and done once.
    kernel_DCF = jnp.stack([gate.kernel, up.kernel], axis=1).astype(dt)
    gate_up_BTCF = jnp.einsum("BTD,DCF->BTCF", x_BTD.astype(dt), kernel_DCF)
    if cfg.mlp_bias:
      gate_up_BTCF = gate_up_BTCF + _lead(jnp.stack([gate.bias, up.bias]).astype(dt), 4)
    gate_BTF, up_BTF = gate_up_BTCF[:, :, 0], gate_up_BTCF[:, :, 1]
    bias_out = (sh.EMBED,) if cfg.mlp_bias else None
    return Linear("BTF,FD->BTD", (F, D), (sh.MLP, sh.EMBED), bias_out, dt, pdt,
                  name="down_proj")(jax.nn.silu(gate_BTF) * up_BTF)


class Block(nn.Module):
  """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x))."""
  cfg: ModelConfig
  mesh: Mesh | None = None
  rules: Any = None

  @nn.compact
  def __call__(self, x_BTD, rope, kv_mask_BS, cache, cache_index):
    cfg = self.cfg
    norm = lambda name: RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, cfg.jnp_param_dtype, name=name)
    attn_BTD, cache = Attention(cfg, self.mesh, self.rules, name="attn")(
        norm("input_norm")(x_BTD), rope, kv_mask_BS, cache, cache_index)
    x_BTD = x_BTD + attn_BTD
    x_BTD = x_BTD + Mlp(cfg, name="mlp")(norm("post_attention_norm")(x_BTD))
    x_BTD = sh.constrain(x_BTD, (sh.BATCH, sh.SEQ, None), self.mesh, self.rules)
    return x_BTD, cache


class Transformer(nn.Module):
  """Decoder-only transformer; `head` 'lm' gives logits [B, T, V], 'value' values [B, T].

  Call: (tokens_BT, positions_BT, kv_mask_BS, cache=None, cache_index=0, return_hidden=False)
  -> (logits or values or final hidden states, new cache or None).
  """
  cfg: ModelConfig
  mesh: Mesh | None = None
  rules: Any = None

  def setup(self):
    cfg = self.cfg
    self.embed = self.param("embed", nn.with_logical_partitioning(_init, (sh.VOCAB, sh.EMBED)),
                            (cfg.vocab_size, cfg.hidden_size), cfg.jnp_param_dtype)
    block = nn.remat(Block) if cfg.remat else Block
    self.layers = [block(cfg, self.mesh, self.rules) for _ in range(cfg.num_layers)]
    self.final_norm = RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, cfg.jnp_param_dtype)
    if cfg.head == "value":
      self.value_head = value_head.ValueHead(cfg.jnp_dtype, cfg.jnp_param_dtype)
    elif not cfg.tie_word_embeddings:
      self.lm_head = self.param("lm_head", nn.with_logical_partitioning(_init, (sh.EMBED, sh.VOCAB)),
                                (cfg.hidden_size, cfg.vocab_size), cfg.jnp_param_dtype)

  def __call__(self, tokens_BT, positions_BT, kv_mask_BS, cache=None, cache_index=0,
               return_hidden=False):
    x_BTD = jnp.take(self.embed, tokens_BT, axis=0).astype(self.cfg.jnp_dtype)
    x_BTD = sh.constrain(x_BTD, (sh.BATCH, sh.SEQ, None), self.mesh, self.rules)
    rope = rope_tables(positions_BT, rope_inv_freq(self.cfg))  # shared by all layers
    new_cache = []
    for i, layer in enumerate(self.layers):
      x_BTD, layer_cache = layer(x_BTD, rope, kv_mask_BS,
                                 None if cache is None else cache[i], cache_index)
      new_cache.append(layer_cache)
    x_BTD = self.final_norm(x_BTD)
    new_cache = None if cache is None else tuple(new_cache)
    if return_hidden:
      return x_BTD, new_cache
    return self.unembed(x_BTD), new_cache

  def unembed(self, x_BTD):
    """Final hidden states -> float32 logits [B, T, V] (or values [B, T] for the value head)."""
    dt = self.cfg.jnp_dtype
    if self.cfg.head == "value":
      return self.value_head(x_BTD)
    if self.cfg.tie_word_embeddings:
      logits_BTV = jnp.einsum("BTD,VD->BTV", x_BTD.astype(dt), self.embed.astype(dt))
    else:
      logits_BTV = jnp.einsum("BTD,DV->BTV", x_BTD.astype(dt), self.lm_head.astype(dt))
    logits_BTV = sh.constrain(logits_BTV, (sh.BATCH, sh.SEQ, sh.VOCAB), self.mesh, self.rules)
    return logits_BTV.astype(jnp.float32)
