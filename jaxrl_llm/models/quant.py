"""The frozen base of QLoRA: the layers' projection kernels stored in int8.

Each kernel of `Linear` (q/k/v, o, gate/up, down; [in..., out...]) is stored as int8
values and one float32 scale per output channel (the absolute maximum over the input dims,
over 127), symmetric, round to nearest. A forward dequantizes in the compute dtype
(`dequantize`): int8 * scale, then the matmul (weight-only quantization: the matmul runs
in the compute dtype, the int8 halves what bf16 storage holds). Embeddings, norms, the lm
head and an MoE layer's router and experts stay as they are (QLoRA keeps embeddings and
the head in 16 bits too).

`ModelConfig.base_quant = 'int8'` makes `Linear` declare the int8 `kernel` and its
`kernel_scale`; `quantize_params` turns a float tree into that layout.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.config import LORA_TARGETS

SCALE = "kernel_scale"


def quantize(kernel: jax.Array, num_in: int, lead: int = 0) -> tuple[jax.Array, jax.Array]:
  """float kernel [lead..., in..., out...] -> (int8 values, float32 scales [lead..., 1...,
  out...]): w ~= values * scales."""
  w = kernel.astype(jnp.float32)
  axes = tuple(range(lead, lead + num_in))
  scale = jnp.max(jnp.abs(w), axis=axes, keepdims=True) / 127.0
  scale = jnp.where(scale > 0, scale, 1.0)
  values = jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8)
  return values, scale


def dequantize(values, scale, dtype) -> jax.Array:
  """int8 values * scales, in `dtype` (the compute dtype)."""
  return values.astype(dtype) * scale.astype(dtype)


# The input dims of each projection's kernel (the leading ones; the rest are its outputs).
NUM_INPUTS = {"qkv_proj": 1, "o_proj": 2, "gate_up_proj": 1, "down_proj": 1}


def _is_projection(path: tuple[str, ...], node) -> bool:
  return (len(path) >= 1 and path[-1] in LORA_TARGETS and isinstance(node, dict)
          and "kernel" in node and node["kernel"].ndim >= 2)


def quantize_params(params: dict[str, Any], layer_stacks: tuple[str, ...]) -> dict[str, Any]:
  """A float parameter tree -> the int8 layout of `base_quant='int8'`: every projection of
  the layer stacks (`ModelConfig.stack_names`) gets int8 `kernel` and its `kernel_scale`
  (jitted: on device, in the kernels' shardings); everything else is kept."""
  def walk(node, path):
    if _is_projection(path, node) and path[0] in layer_stacks:
      values, scale = _quantize_layers(node["kernel"], NUM_INPUTS[path[-1]])
      return dict(node, kernel=values, **{SCALE: scale})
    if isinstance(node, dict):
      return {k: walk(v, path + (k,)) for k, v in node.items()}
    return node
  return walk(params, ())


# A stacked kernel [L, in..., out...], on the devices it lies on.
_quantize_layers = jax.jit(lambda kernel, num_in: quantize(kernel, num_in, lead=1),
                           static_argnums=(1,))


def quantized_bytes(params) -> dict[str, int]:
  """Bytes of the layers' projection kernels (int8 values plus scales, or float) and of
  everything else: {'projections': ..., 'other': ...}."""
  out = {"projections": 0, "other": 0}

  def walk(node, path):
    if isinstance(node, dict):
      for k, v in node.items():
        walk(v, path + (k,))
      return
    part = ("projections" if len(path) >= 2 and path[-2] in LORA_TARGETS
            and path[-1] in ("kernel", SCALE) else "other")
    out[part] += int(np.prod(node.shape)) * jnp.dtype(node.dtype).itemsize
  walk(params, ())
  return out
