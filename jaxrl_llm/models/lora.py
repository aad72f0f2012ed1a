"""LoRA adapters: what they are in the parameter tree, merged, exported for PEFT.

A projection of `ModelConfig.lora_targets` carries, beside its frozen kernel [in..., out...],
`lora_a` [in..., r] and `lora_b` [r, out...] (float32; B starts at zero, so a fresh adapter
changes nothing), and computes x @ W + (alpha / r) * (x @ A) @ B (`transformer.Linear`). A
fused kernel carries one adapter: q/k/v share one A (their B is one [r, K, G + 2, Dh]
tensor), gate/up too. That is a LoRA of rank r on each of q, k and v whose A matrices are
equal, so it exports to PEFT exactly: A is written once per projection, B is cut by part.

The trainer keeps the adapters (`split`'s second tree) in the train state and the base
(the first) frozen beside it; `join` puts them back together for a forward. The base with
the adapters off (`ModelConfig.without_lora`) is the reference model: no second copy.

PEFT's layout (`peft_tensors`, `adapter_config`): for layer i and a Hugging Face module
such as `self_attn.q_proj`, `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`
[r, in] and `...lora_B.weight` [out, r], with `lora_alpha`, `r` and `target_modules` in
adapter_config.json; `peft.PeftModel.from_pretrained(base, DIR)` loads it.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import quant
from jaxrl_llm.models.config import ModelConfig

ADAPTER_LEAVES = ("lora_a", "lora_b")
# Our projections -> the Hugging Face modules they fuse (Llama, Qwen2, Qwen3 and the
# attention of Qwen3-MoE and Mixtral).
HF_MODULES = {"qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
              "o_proj": ("self_attn.o_proj",),
              "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
              "down_proj": ("mlp.down_proj",)}
PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"


def split(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """A tree -> (the base: every leaf but the adapters', the adapters), same nesting."""
  base, adapters = {}, {}
  for key, value in params.items():
    if isinstance(value, dict):
      b, a = split(value)
      if b:
        base[key] = b
      if a:
        adapters[key] = a
    elif key in ADAPTER_LEAVES:
      adapters[key] = value
    else:
      base[key] = value
  return base, adapters


def join(base: dict[str, Any], adapters: dict[str, Any]) -> dict[str, Any]:
  """Inverse of `split`: one tree holding both."""
  out = dict(base)
  for key, value in adapters.items():
    out[key] = join(out.get(key, {}), value) if isinstance(value, dict) else value
  return out


def _delta(a, b, kernel_ndim: int):
  """(A @ B) in the kernel's shape: a [lead..., in..., r], b [lead..., r, out...], one
  contraction over r with no reshape (flattening a kernel's sharded output dims with its
  others would gather them whole on every chip)."""
  lead = a.ndim + b.ndim - 2 - kernel_ndim
  n_in, n_out = a.ndim - 1 - lead, b.ndim - 1 - lead
  letters = iter("abcdefghijklmnopqstuvwxyz")  # 'r' is the rank
  lead_l, in_l, out_l = ("".join(next(letters) for _ in range(n)) for n in (lead, n_in, n_out))
  return jnp.einsum(f"{lead_l}{in_l}r,{lead_l}r{out_l}->{lead_l}{in_l}{out_l}",
                    a.astype(jnp.float32), b.astype(jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


def merge(params: dict[str, Any], cfg: ModelConfig, dtype=None) -> dict[str, Any]:
  """The adapters added into their kernels: kernel + (alpha / r) * A @ B, each kernel in
  `dtype` (default: the config's param dtype; an int8 kernel is dequantized first). The
  tree runs with `merged_config(cfg)`. Call inside jit to merge on the devices."""
  dtype = cfg.jnp_param_dtype if dtype is None else dtype

  def walk(node):
    if not isinstance(node, dict):
      return node
    if "kernel" in node and not isinstance(node["kernel"], dict):
      kernel = node["kernel"]
      if quant.SCALE in node:
        kernel = quant.dequantize(kernel, node[quant.SCALE], jnp.float32)
      if "lora_a" in node:
        kernel = kernel.astype(jnp.float32) + cfg.lora_scale * _delta(
            node["lora_a"], node["lora_b"], kernel.ndim)
      rest = {k: v for k, v in node.items()
              if k not in ADAPTER_LEAVES and k not in ("kernel", quant.SCALE)}
      return dict(rest, kernel=kernel.astype(dtype))
    return {k: walk(v) for k, v in node.items()}
  return walk(params)


def merged_config(cfg: ModelConfig) -> ModelConfig:
  """The config `merge`'s tree runs with: no adapters, float kernels."""
  return cfg.without_lora().replace(base_quant="none")


# --- PEFT export ---------------------------------------------------------------------------------
def _peft_pairs(name: str, a, b, cfg: ModelConfig):
  """One layer's adapter of projection `name` -> (HF module, lora_A [r, in], lora_B [out, r])."""
  r = a.shape[-1]
  a_T = np.ascontiguousarray(a.reshape(-1, r).T)
  if name == "qkv_proj":
    G = cfg.num_heads // cfg.num_kv_heads
    parts = (b[:, :, :G], b[:, :, G], b[:, :, G + 1])
  elif name == "gate_up_proj":
    parts = (b[:, 0], b[:, 1])
  else:
    parts = (b,)
  for module, part in zip(HF_MODULES[name], parts):
    yield module, a_T, np.ascontiguousarray(part.reshape(r, -1).T)


def peft_tensors(adapters: dict[str, Any], cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
  """(PEFT tensor name, float32 host array) of every adapter, layer by layer."""
  from jaxrl_llm.models import load  # load imports this module's neighbours only
  for i, (stack, j, kind) in enumerate(load.layer_places(cfg)):
    for group in ("attn", "mlp"):
      for name, node in adapters.get(stack, {}).get(group, {}).items():
        a, b = (np.asarray(node[k][j], np.float32) for k in ADAPTER_LEAVES)
        for module, lora_a, lora_b in _peft_pairs(name, a, b, cfg):
          prefix = f"base_model.model.model.layers.{i}.{module}"
          yield f"{prefix}.lora_A.weight", lora_a
          yield f"{prefix}.lora_B.weight", lora_b


def adapter_config(cfg: ModelConfig, base_model_name_or_path: str | None) -> dict[str, Any]:
  """adapter_config.json of PEFT's LoRA for `cfg`'s adapters."""
  modules = sorted({m.split(".")[-1] for t in cfg.lora_targets for m in HF_MODULES[t]})
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.lora_rank,
          "lora_alpha": cfg.lora_alpha, "lora_dropout": cfg.lora_dropout,
          "target_modules": modules, "bias": "none", "fan_in_fan_out": False,
          "use_rslora": False, "use_dora": False, "init_lora_weights": True,
          "modules_to_save": None, "inference_mode": True,
          "base_model_name_or_path": base_model_name_or_path}


# --- the base's fingerprint -----------------------------------------------------------------------
def _checksum(x: jax.Array) -> jax.Array:
  """sum over elements of bits(x) * (2 * flat index + 1), mod 2^32: integer arithmetic, so
  the same for every sharding and reduction order."""
  bits = jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32,
                                          8: jnp.uint32}[x.dtype.itemsize])
  bits = bits.reshape(bits.shape[:x.ndim] + (-1,)) if bits.ndim > x.ndim else bits[..., None]
  index = jnp.zeros(bits.shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(bits.ndim)):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, bits.shape, axis) * jnp.uint32(stride)
    stride = (stride * bits.shape[axis]) % 2**32
  return jnp.sum(bits.astype(jnp.uint32) * (2 * index + 1), dtype=jnp.uint32)


def fingerprint(base: dict[str, Any]) -> str:
  """A hex digest of the frozen base's every value, name, shape and dtype: what a LoRA
  checkpoint records of the base it was trained on. Every process gets the same digest."""
  leaves = jax.tree_util.tree_flatten_with_path(base)[0]
  sums = jax.jit(lambda xs: [_checksum(x) for x in xs])([x for _, x in leaves])
  digest = hashlib.sha256()
  for (path, x), s in zip(leaves, jax.device_get(sums)):
    digest.update(json.dumps([jax.tree_util.keystr(path), list(x.shape), str(x.dtype),
                              int(s)]).encode())
  return digest.hexdigest()[:16]
