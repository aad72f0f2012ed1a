"""The decoder: Embed -> L x Block(RMSNorm, Attention, RMSNorm, Mlp) -> RMSNorm -> head.

One Flax module covers Llama 3, Qwen2 and Qwen3 (see `ModelConfig`).

Layers are one `Block` scanned L times (`nn.scan`) over parameters stacked on a leading
`layers` axis, as in MaxText and gemma: every program (forward, backward, decode step) holds
one layer's code, so compile time does not grow with depth. What the backward pass keeps of
each layer is `ModelConfig.remat` (a `jax.checkpoint` policy).

Weights are stored in the layout the matmuls use, so no forward (or backward) concatenates
kernels: q, k and v are one kernel [D, K, G + 2, Dh] (per kv head: its G query heads, its key,
its value, so the kv-head axis keeps the tensor sharding), gate and up one kernel [D, 2, F].
`load` translates from and to the Hugging Face layout. This is the model's one way of
running its layers; how a decode loop is tuned for a platform (RoPE tables, layers run
one by one) is the sampler's business (`sampling.DECODE_TUNING`), which calls the same
`Block` and the methods `embed_tokens`, `normalize` and `unembed`.

Attention reads keys from the current tokens (`attention.causal_attention`) or from all the
written slots of a KV cache (`attention.cache_attention`; the cache layouts, including the
sampler's shared prompt prefix, are in `kv_cache`). A query at slot i sees key slot j iff
j <= i and `kv_mask[b, j]`, so left-padded prompts give the same values for their real
tokens as unpadded ones.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_llm import sharding as sh
from jaxrl_llm.models import attention, kv_cache, moe, quant, value_head
from jaxrl_llm.models.config import ModelConfig

_init = nn.initializers.normal(stddev=0.02)
# What each ModelConfig.remat keeps for the backward pass (None: nothing but the layer input).
_REMAT_POLICIES = {"dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable, "full": None}


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


def rope_angles(positions_BT: jax.Array, cfg: ModelConfig) -> jax.Array:
  """position * inv_freq [B, T, Dh/2], float32."""
  return positions_BT.astype(jnp.float32)[:, :, None] * rope_inv_freq(cfg)[None, None, :]


def rope_tables(positions_BT: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, T, Dh] of position * inv_freq, the angles repeated for both halves."""
  freqs_BTf = rope_angles(positions_BT, cfg)
  both_BTd = lambda table_BTf: jnp.concatenate([table_BTf, table_BTf], axis=-1)
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
  """y = einsum(eqn, x, kernel) (+ bias over the kernel's trailing `len(bias_axes)` dims).

  The kernel is [in..., out...] (its leading dims are contracted with x). With `lora`
  (rank r, scale) it also carries a LoRA adapter (`lora`): lora_a [in..., r] and lora_b
  [r, out...], float32, adding scale * (x @ lora_a) @ lora_b; with `lora_dropout` and a
  'dropout' key in the call, dropout on the adapter's input (PEFT's). `quantized`: the
  kernel is int8 with a float32 `kernel_scale` per output channel (`quant`), dequantized in
  the compute dtype.
  """
  eqn: str
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_axes: tuple[str, ...] | None
  dtype: Any
  param_dtype: Any
  lora: tuple[int, float] | None = None
  lora_dropout: float = 0.0
  quantized: bool = False

  def setup(self):  # not compact: a parent may read `kernel` and `bias` without calling
    n_in = len(_eqn_parts(self.eqn)[1])
    in_shape, out_shape = self.kernel_shape[:n_in], self.kernel_shape[n_in:]
    in_axes, out_axes = self.kernel_axes[:n_in], self.kernel_axes[n_in:]
    if self.quantized:
      self.kernel = self.param("kernel", nn.with_logical_partitioning(_int8_init, self.kernel_axes),
                               self.kernel_shape, jnp.int8)
      self.kernel_scale = self.param(
          quant.SCALE, nn.with_logical_partitioning(_int8_scale_init, (None,) * n_in + out_axes),
          (1,) * n_in + out_shape, jnp.float32)
    else:
      self.kernel = self.param("kernel", nn.with_logical_partitioning(_init, self.kernel_axes),
                               self.kernel_shape, self.param_dtype)
    self.bias = None
    if self.bias_axes is not None:
      shape = self.kernel_shape[len(self.kernel_shape) - len(self.bias_axes):]
      self.bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, self.bias_axes),
                             shape, self.param_dtype)
    if self.lora is not None:
      rank = self.lora[0]
      bound = float(np.prod(in_shape)) ** -0.5  # PEFT's kaiming_uniform(a=sqrt(5)) of A
      self.lora_a = self.param(
          "lora_a", nn.with_logical_partitioning(_symmetric_uniform(bound), in_axes + (None,)),
          in_shape + (rank,), jnp.float32)
      self.lora_b = self.param("lora_b", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                      (None,) + out_axes),
                               (rank,) + out_shape, jnp.float32)

  def __call__(self, x):
    dt = self.dtype
    kernel = (quant.dequantize(self.kernel, self.kernel_scale, dt) if self.quantized
              else self.kernel.astype(dt))
    y = jnp.einsum(self.eqn, x.astype(dt), kernel)
    if self.lora is not None:
      y = y + self._adapter(x)
    if self.bias is not None:
      y = y + _lead(self.bias.astype(dt), y.ndim)
    return y

  def _adapter(self, x):
    """scale * (dropout(x) @ lora_a) @ lora_b, in the compute dtype."""
    x_letters, k_in, k_out, y_letters = _eqn_parts(self.eqn)
    rows = "".join(c for c in x_letters if c not in k_in)
    dt = self.dtype
    if self.lora_dropout > 0 and self.has_rng("dropout"):
      keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.lora_dropout, x.shape)
      x = jnp.where(keep, x / (1.0 - self.lora_dropout), 0).astype(x.dtype)
    h = jnp.einsum(f"{x_letters},{k_in}r->{rows}r", x.astype(dt), self.lora_a.astype(dt))
    h = h * jnp.asarray(self.lora[1], dt)
    return jnp.einsum(f"{rows}r,r{k_out}->{y_letters}", h, self.lora_b.astype(dt))


def _eqn_parts(eqn: str) -> tuple[str, str, str, str]:
  """`Linear`'s 'x,kernel->y' -> (x's letters, the kernel's input letters (its leading,
  contracted ones), its output letters, y's letters)."""
  x_letters, rest = eqn.split(",")
  k_letters, y_letters = rest.split("->")
  n_in = sum(c in x_letters for c in k_letters)
  return x_letters, k_letters[:n_in], k_letters[n_in:], y_letters


def _symmetric_uniform(bound: float):
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def _int8_init(key, shape, dtype=jnp.int8):
  """A random int8 kernel (with `_int8_scale_init`, uniform of the float init's std)."""
  return jax.random.randint(key, shape, -127, 128).astype(dtype)


def _int8_scale_init(key, shape, dtype=jnp.float32):
  del key
  return jnp.full(shape, 0.02 * 3 ** 0.5 / 127, dtype)


def _linear_options(cfg: ModelConfig, name: str) -> dict[str, Any]:
  """`Linear`'s adapter and storage options for projection `name` of a layer."""
  lora = (cfg.lora_rank, cfg.lora_scale) if name in cfg.lora_targets else None
  return dict(lora=lora, lora_dropout=cfg.lora_dropout, quantized=cfg.base_quant == "int8")


class Attention(nn.Module):
  """Grouped-query attention with RoPE and optional q/k norm (and a KV cache: written, then read)."""
  cfg: ModelConfig
  mesh: Mesh | None = None
  rules: Any = None

  @nn.compact
  def __call__(self, x_BTD, rope, kv_mask_BS, layer_cache, cache_index):
    cfg = self.cfg
    D, H, K, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dt, pdt = cfg.jnp_dtype, cfg.jnp_param_dtype
    G = H // K  # GQA: each of the K kv heads serves G query heads
    B, T = x_BTD.shape[:2]
    # One matmul for q, k and v: per kv head, its G query heads, then its key and its value.
    qkv_BTKCd = Linear("BTD,DKCd->BTKCd", (D, K, G + 2, Dh), (sh.EMBED, sh.KV_HEADS, None, sh.HEAD_DIM),
                       (sh.KV_HEADS, None, sh.HEAD_DIM) if cfg.qkv_bias else None, dt, pdt,
                       **_linear_options(cfg, "qkv_proj"), name="qkv_proj")(x_BTD)
    q_BTKGd, k_BTKd, v_BTKd = qkv_BTKCd[:, :, :, :G], qkv_BTKCd[:, :, :, G], qkv_BTKCd[:, :, :, G + 1]
    if cfg.qk_norm:  # Qwen3: RMSNorm over head_dim, before RoPE
      q_BTKGd = RMSNorm(cfg.rms_norm_eps, dt, pdt, sh.HEAD_DIM, name="q_norm")(q_BTKGd)
      k_BTKd = RMSNorm(cfg.rms_norm_eps, dt, pdt, sh.HEAD_DIM, name="k_norm")(k_BTKd)
    q_BTKGd = apply_rope(q_BTKGd.reshape(B, T, H, Dh), *rope).reshape(B, T, K, G, Dh)
    k_BTKd = apply_rope(k_BTKd, *rope)
    if layer_cache is None:  # the T tokens see each other only
      out_BTKGd = attention.causal_attention(q_BTKGd, k_BTKd, v_BTKd, kv_mask_BS, impl=cfg.attention,
                                             mesh=self.mesh, rules=self.rules)
    else:  # this step's keys/values at slots [cache_index, cache_index + T), in place, then read
      layer_cache = kv_cache.write(layer_cache, k_BTKd.transpose(0, 2, 1, 3),
                                   v_BTKd.transpose(0, 2, 1, 3), cache_index)
      out_BTKGd = attention.cache_attention(q_BTKGd, layer_cache, kv_mask_BS, cache_index)
    out_BTHd = sh.constrain(out_BTKGd.reshape(B, T, H, Dh), (sh.BATCH, sh.SEQ, sh.HEADS, sh.HEAD_DIM),
                            self.mesh, self.rules)
    o_bias = (sh.EMBED,) if cfg.o_bias else None
    out_BTD = Linear("BTHd,HdD->BTD", (H, Dh, D), (sh.HEADS, sh.HEAD_DIM, sh.EMBED), o_bias, dt, pdt,
                     **_linear_options(cfg, "o_proj"), name="o_proj")(out_BTHd)
    return out_BTD, layer_cache, (k_BTKd.transpose(0, 2, 1, 3), v_BTKd.transpose(0, 2, 1, 3))


class Mlp(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one matmul."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.cfg
    D, F, dt, pdt = cfg.hidden_size, cfg.intermediate_size, cfg.jnp_dtype, cfg.jnp_param_dtype
    # Gate and up stacked on a new axis, not concatenated along F, so that F keeps its sharding.
    gate_up_BTCF = Linear("BTD,DCF->BTCF", (D, 2, F), (sh.EMBED, None, sh.MLP),
                          (None, sh.MLP) if cfg.mlp_bias else None, dt, pdt,
                          **_linear_options(cfg, "gate_up_proj"), name="gate_up_proj")(x_BTD)
    hidden_BTF = jax.nn.silu(gate_up_BTCF[:, :, 0]) * gate_up_BTCF[:, :, 1]
    bias_out = (sh.EMBED,) if cfg.mlp_bias else None
    return Linear("BTF,FD->BTD", (F, D), (sh.MLP, sh.EMBED), bias_out, dt, pdt,
                  **_linear_options(cfg, "down_proj"), name="down_proj")(hidden_BTF)


class Block(nn.Module):
  """One pre-norm residual layer: x + attn(norm(x)), then + mlp(norm(x)); the MLP is dense
  or, with `kind` 'moe', a mixture of experts (`moe.MoeMlp`).

  (x_BTD, layer_cache or None, rope, kv_mask_BS, cache_index, replay_BTk or None) ->
  (x_BTD, (out, router)) where `out` is the written layer cache, or with `returns_kv`
  (scanned: the stacked cache is written after the scan) this step's keys and values
  [B, K, T, Dh]; None without a cache. `router` is an MoE layer's routing (the experts it
  used [B, T, k] and its statistics, `moe.MoeMlp`), None for a dense one; `replay_BTk` the
  experts an MoE layer must use instead (routing replay; -1: its own choice).
  """
  cfg: ModelConfig
  mesh: Mesh | None = None
  rules: Any = None
  returns_kv: bool = False
  kind: str = "dense"

  @nn.compact
  def __call__(self, x_BTD, layer_cache, rope, kv_mask_BS, cache_index, replay_BTk=None):
    cfg = self.cfg
    norm = lambda name: RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, cfg.jnp_param_dtype, name=name)
    attn_BTD, layer_cache, new_kv = Attention(cfg, self.mesh, self.rules, name="attn")(
        norm("input_norm")(x_BTD), rope, kv_mask_BS, layer_cache, cache_index)
    x_BTD = x_BTD + attn_BTD
    h_BTD, router = norm("post_attention_norm")(x_BTD), None
    if self.kind == "moe":  # statistics over the real tokens (all of them while decoding)
      token_weights_BT = kv_mask_BS if layer_cache is None else jnp.ones(x_BTD.shape[:2])
      mlp_BTD, router = moe.MoeMlp(cfg, self.mesh, self.rules, name="mlp")(
          h_BTD, token_weights_BT, replay_BTk)
    else:
      mlp_BTD = Mlp(cfg, name="mlp")(h_BTD)
    x_BTD = sh.constrain(x_BTD + mlp_BTD, (sh.BATCH, sh.SEQ, None), self.mesh, self.rules)
    if layer_cache is None:
      return x_BTD, (None, router)
    return x_BTD, (new_kv if self.returns_kv else layer_cache, router)


def scanned_layers(cfg: ModelConfig, length: int) -> type[nn.Module]:
  """`Block` scanned over `length` layers (rematerialised by cfg.remat)."""
  block = Block
  if cfg.remat != "none":
    block = nn.remat(Block, policy=_REMAT_POLICIES[cfg.remat], prevent_cse=False)
  return nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                 in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, 0), length=length,
                 metadata_params={nn.PARTITION_NAME: sh.LAYERS})


def routing_summary(routers: list[dict]) -> dict[str, jax.Array]:
  """The MoE layers' routing, stacked in layer order: 'experts' [B, T, Lm, k] (the experts
  each token used) and the statistics [Lm, ...] of `moe.router_stats`."""
  stacked = jax.tree.map(lambda *xs: jnp.concatenate(xs), *routers)
  return dict(stacked, experts=jnp.moveaxis(stacked["experts"], 0, 2))


class Transformer(nn.Module):
  """Decoder-only transformer; `head` 'lm' gives logits [B, T, V], 'value' values [B, T].

  Call: (tokens_BT, positions_BT, kv_mask_BS, cache=None, cache_index=0, return_hidden=False,
  rope=None, routing_BTLk=None, with_router=False) -> (logits or values or final hidden
  states, new cache or None[, routing]). With a cache (`kv_cache`, stacked over layers), the
  T tokens go to slots [cache_index, cache_index + T) and `kv_mask_BS` covers all of its
  slots. `rope`: the (cos, sin) tables of the positions when the caller computes them its
  own way (default: `rope_tables`). An MoE model: `routing_BTLk` replays recorded experts
  (int32 [B, T, MoE layers, k], -1: the layer's own choice), and `with_router` also returns
  the routing (`routing_summary`).

  The layers are one scan per run of layers of one kind (`ModelConfig.segments`): one for
  a dense model and for one whose every layer is MoE, more where dense and MoE layers
  alternate (Qwen3-MoE's `decoder_sparse_step`, `mlp_only_layers`), each run's cache
  slice copied in and out.
  """
  cfg: ModelConfig
  mesh: Mesh | None = None
  rules: Any = None

  def setup(self):
    cfg = self.cfg
    self.embed = self.param("embed", nn.with_logical_partitioning(_init, (sh.VOCAB, sh.EMBED)),
                            (cfg.vocab_size, cfg.hidden_size), cfg.jnp_param_dtype)
    # Named by the attribute: 'layers', or 'layers_0', 'layers_1', ... (`ModelConfig.stack_names`).
    stacks = [scanned_layers(cfg, stop - start)(cfg, self.mesh, self.rules, returns_kv=True,
                                                kind=kind)
              for kind, start, stop in cfg.segments]
    self.layers = stacks[0] if len(stacks) == 1 else stacks
    self.final_norm = RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, cfg.jnp_param_dtype)
    if cfg.head == "value":
      self.value_head = value_head.ValueHead(cfg.jnp_dtype, cfg.jnp_param_dtype)
    elif not cfg.tie_word_embeddings:
      self.lm_head = self.param("lm_head", nn.with_logical_partitioning(_init, (sh.EMBED, sh.VOCAB)),
                                (cfg.hidden_size, cfg.vocab_size), cfg.jnp_param_dtype)

  def __call__(self, tokens_BT, positions_BT, kv_mask_BS, cache=None, cache_index=0,
               return_hidden=False, rope=None, routing_BTLk=None, with_router=False):
    x_BTD = self.embed_tokens(tokens_BT)
    if rope is None:
      rope = rope_tables(positions_BT, self.cfg)  # shared by all layers
    if not isinstance(cache_index, kv_cache.PagedIndex):
      cache_index = jnp.asarray(cache_index)
    stacks = self.layers if isinstance(self.layers, (list, tuple)) else [self.layers]
    new_kvs, routers, moe_done = [], [], 0
    for stack, (kind, start, stop) in zip(stacks, self.cfg.segments):
      part = cache if cache is None or len(stacks) == 1 else {
          name: buf[start:stop] for name, buf in cache.items()}
      replay = None
      if kind == "moe" and routing_BTLk is not None:  # [B, T, Lm, k] -> this run's [l, B, T, k]
        replay = jnp.moveaxis(routing_BTLk[:, :, moe_done:moe_done + stop - start], 2, 0)
      x_BTD, (new_kv, router) = stack(x_BTD, part, rope, kv_mask_BS, cache_index, replay)
      new_kvs.append(new_kv)
      if kind == "moe":
        routers.append(router)
        moe_done += stop - start
    new_cache = None
    if cache is not None:
      new_kv = new_kvs[0] if len(new_kvs) == 1 else jax.tree.map(
          lambda *xs: jnp.concatenate(xs), *new_kvs)
      new_cache = kv_cache.write(cache, *new_kv, cache_index)
    x_BTD = self.normalize(x_BTD)
    out = x_BTD if return_hidden else self.unembed(x_BTD)
    if with_router:
      return out, new_cache, routing_summary(routers) if routers else None
    return out, new_cache

  def embed_tokens(self, tokens_BT):
    """Token ids -> the first layer's input [B, T, D] in the compute dtype."""
    x_BTD = jnp.take(self.embed, tokens_BT, axis=0).astype(self.cfg.jnp_dtype)
    return sh.constrain(x_BTD, (sh.BATCH, sh.SEQ, None), self.mesh, self.rules)

  def normalize(self, x_BTD):
    """The final norm: the last layer's output -> the final hidden states."""
    return self.final_norm(x_BTD)

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
