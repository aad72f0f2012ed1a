"""Hugging Face checkpoints <-> our parameter tree.

Reads `config.json` plus `model.safetensors` or a sharded `model.safetensors.index.json`
from a local directory, and writes the same layout back so that
`transformers.AutoModelForCausalLM.from_pretrained` loads it. Tensors are read through
memory maps, one at a time, so a process never holds two copies of the checkpoint.
"""
from __future__ import annotations

import json
import math
import os
import struct
from typing import Any, Iterator

import ml_dtypes
import numpy as np
import safetensors.numpy

from jaxrl_llm.models.config import ModelConfig

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"

_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
# Buffers some older checkpoints carry; they are recomputed, never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# --- the name map ---------------------------------------------------------------------------
# (path in our tree, HF name (under `model.layers.{i}.` for layers), n_in): n_in is the number
# of leading input dims of our kernel (HF stores Linear weights as [out, in]), None for
# norms and biases that are flat in HF, 0 for tensors stored identically.
def _layer_entries(cfg: ModelConfig) -> list[tuple[tuple[str, ...], str, int | None]]:
  e = [
      (("input_norm", "scale"), "input_layernorm.weight", None),
      (("post_attention_norm", "scale"), "post_attention_layernorm.weight", None),
      (("attn", "q_proj", "kernel"), "self_attn.q_proj.weight", 1),
      (("attn", "k_proj", "kernel"), "self_attn.k_proj.weight", 1),
      (("attn", "v_proj", "kernel"), "self_attn.v_proj.weight", 1),
      (("attn", "o_proj", "kernel"), "self_attn.o_proj.weight", 2),
      (("mlp", "gate_proj", "kernel"), "mlp.gate_proj.weight", 1),
      (("mlp", "up_proj", "kernel"), "mlp.up_proj.weight", 1),
      (("mlp", "down_proj", "kernel"), "mlp.down_proj.weight", 1),
  ]
  if cfg.qkv_bias:
    e += [(("attn", p, "bias"), f"self_attn.{p}.bias", None) for p in ("q_proj", "k_proj", "v_proj")]
  if cfg.o_bias:
    e += [(("attn", "o_proj", "bias"), "self_attn.o_proj.bias", None)]
  if cfg.qk_norm:
    e += [(("attn", n, "scale"), f"self_attn.{n}.weight", None) for n in ("q_norm", "k_norm")]
  if cfg.mlp_bias:
    e += [(("mlp", p, "bias"), f"mlp.{p}.bias", None) for p in ("gate_proj", "up_proj", "down_proj")]
  return e


def _top_entries(cfg: ModelConfig) -> list[tuple[tuple[str, ...], str, int | None]]:
  e = [(("embed",), "model.embed_tokens.weight", 0), (("final_norm", "scale"), "model.norm.weight", None)]
  if not cfg.tie_word_embeddings:
    e.append((("lm_head",), "lm_head.weight", 1))
  return e


def _to_ours(w: np.ndarray, shape: tuple[int, ...], n_in: int | None) -> np.ndarray:
  if n_in is None or n_in == 0:
    return w.reshape(shape)
  return w.T.reshape(shape)  # HF Linear is [out, in]; our kernels are [in..., out...]


def _to_hf(x: np.ndarray, n_in: int | None) -> np.ndarray:
  if n_in == 0:
    return x
  if n_in is None:
    return x.reshape(-1)
  return x.reshape(math.prod(x.shape[:n_in]), -1).T


def _hf_shape(shape: tuple[int, ...], n_in: int | None) -> tuple[int, ...]:
  if n_in == 0:
    return tuple(shape)
  if n_in is None:
    return (math.prod(shape),)
  return (math.prod(shape[n_in:]), math.prod(shape[:n_in]))


# --- reading ----------------------------------------------------------------------------------
class _SafetensorsDir:
  """Name -> memory-mapped tensor over one or several .safetensors files of a directory."""

  def __init__(self, path: str):
    single, index = os.path.join(path, WEIGHTS_FILE), os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      files = sorted(set(weight_map.values()))
    elif os.path.exists(single):
      files = [WEIGHTS_FILE]
    else:
      raise FileNotFoundError(_no_weights(path))
    self.entries: dict[str, tuple[str, Any, tuple[int, ...], int]] = {}
    for name in files:
      file = os.path.join(path, name)
      if not os.path.exists(file):
        raise FileNotFoundError(f"{INDEX_FILE} in {path!r} names {name!r}, which does not exist")
      with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
      header.pop("__metadata__", None)
      for key, info in header.items():
        if info["dtype"] not in _ST_DTYPES:
          raise ValueError(f"tensor {key!r} in {file!r} has unsupported dtype {info['dtype']!r}")
        begin, _ = info["data_offsets"]
        self.entries[key] = (file, _ST_DTYPES[info["dtype"]], tuple(info["shape"]), 8 + n + begin)

  def names(self) -> set[str]:
    return set(self.entries)

  def shape(self, name: str) -> tuple[int, ...]:
    return self.entries[name][2]

  def get(self, name: str) -> np.ndarray:
    file, dtype, shape, offset = self.entries[name]
    if math.prod(shape) == 0:
      return np.zeros(shape, dtype)
    return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=shape)


def _no_weights(path: str) -> str:
  return (f"no weights in {path!r}: expected {WEIGHTS_FILE} or {INDEX_FILE} (safetensors); "
          f"the directory holds {sorted(os.listdir(path))[:10]}")


def read_config(path: str) -> dict[str, Any]:
  if not os.path.isdir(path):
    raise FileNotFoundError(f"model path {path!r} does not exist or is not a directory (expected "
                            f"a local Hugging Face model directory with {CONFIG_FILE} and "
                            "safetensors weights)")
  file = os.path.join(path, CONFIG_FILE)
  if not os.path.exists(file):
    raise FileNotFoundError(f"{path!r} has no {CONFIG_FILE}: not a Hugging Face model directory "
                            f"(it holds {sorted(os.listdir(path))[:10]})")
  with open(file) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{file!r} is not valid JSON ({e})") from e


def check_model_dir(path: str) -> dict[str, Any]:
  """The `config.json` of `path`, after checking that safetensors weights sit beside it."""
  hf_config = read_config(path)
  if not any(os.path.exists(os.path.join(path, f)) for f in (WEIGHTS_FILE, INDEX_FILE)):
    raise FileNotFoundError(_no_weights(path))
  return hf_config


def layer_name(i: int) -> str:
  return f"layers_{i}"


def param_shapes(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """Our parameter shapes keyed by tree path."""
  D, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
  H, K, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  per_layer = {
      ("input_norm", "scale"): (D,), ("post_attention_norm", "scale"): (D,),
      ("attn", "q_proj", "kernel"): (D, H, Dh), ("attn", "k_proj", "kernel"): (D, K, Dh),
      ("attn", "v_proj", "kernel"): (D, K, Dh), ("attn", "o_proj", "kernel"): (H, Dh, D),
      ("attn", "q_proj", "bias"): (H, Dh), ("attn", "k_proj", "bias"): (K, Dh),
      ("attn", "v_proj", "bias"): (K, Dh), ("attn", "o_proj", "bias"): (D,),
      ("attn", "q_norm", "scale"): (Dh,), ("attn", "k_norm", "scale"): (Dh,),
      ("mlp", "gate_proj", "kernel"): (D, F), ("mlp", "up_proj", "kernel"): (D, F),
      ("mlp", "down_proj", "kernel"): (F, D), ("mlp", "gate_proj", "bias"): (F,),
      ("mlp", "up_proj", "bias"): (F,), ("mlp", "down_proj", "bias"): (D,),
  }
  shapes = {(layer_name(i),) + p: per_layer[p] for i in range(L) for p, _, _ in _layer_entries(cfg)}
  shapes[("embed",)] = (V, D)
  shapes[("final_norm", "scale")] = (D,)
  if not cfg.tie_word_embeddings:
    shapes[("lm_head",)] = (D, V)
  return shapes


def _set(tree: dict, path: tuple[str, ...], value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: dict, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


def load_params(path: str, cfg: ModelConfig) -> dict[str, Any]:
  """Reads the safetensors of `path` into our (numpy, host) parameter tree for `cfg`."""
  if cfg.head != "lm":
    raise ValueError("Hugging Face checkpoints hold language models; make a value model with "
                     "models.value_model(policy) instead")
  st = _SafetensorsDir(path)
  dtype = _NP_DTYPES[cfg.param_dtype]
  shapes = param_shapes(cfg)
  used = set()

  def read(name: str, ours: tuple[int, ...], n_in: int | None) -> np.ndarray:
    if name not in st.entries:
      raise ValueError(f"checkpoint {path!r} has no tensor {name!r}, which the config "
                       f"(model_type={cfg.model_type!r}) needs")
    expected = _hf_shape(ours, n_in)
    if st.shape(name) != expected:
      raise ValueError(f"tensor {name!r} in {path!r} has shape {list(st.shape(name))}; the "
                       f"config expects {list(expected)}")
    used.add(name)
    return _to_ours(np.asarray(st.get(name), dtype=dtype), ours, n_in)

  params: dict[str, Any] = {}
  for ours, hf, n_in in _top_entries(cfg):
    _set(params, ours, read(hf, shapes[ours], n_in))
  for i in range(cfg.num_layers):
    for ours, hf, n_in in _layer_entries(cfg):
      path = (layer_name(i),) + ours
      _set(params, path, read(f"model.layers.{i}.{hf}", shapes[path], n_in))
  extra = sorted(n for n in st.names() - used if not n.endswith(_IGNORED_SUFFIXES)
                 and not (cfg.tie_word_embeddings and n == "lm_head.weight"))
  if extra:
    raise ValueError(f"checkpoint {path!r} has {len(extra)} tensors the config "
                     f"(model_type={cfg.model_type!r}) does not use, e.g. {extra[:5]}")
  return params


# --- writing ----------------------------------------------------------------------------------
def hf_tensors(params: dict[str, Any], cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (HF name, host array) for every parameter, in HF layout."""
  for ours, hf, n_in in _top_entries(cfg):
    yield hf, np.ascontiguousarray(_to_hf(np.asarray(_get(params, ours)), n_in))
  for i in range(cfg.num_layers):
    for ours, hf, n_in in _layer_entries(cfg):
      x = np.asarray(_get(params, (layer_name(i),) + ours))
      yield f"model.layers.{i}.{hf}", np.ascontiguousarray(_to_hf(x, n_in))


def save_params(tensors: Iterator[tuple[str, np.ndarray]], path: str,
                max_shard_bytes: int = 5 * 2**30) -> None:
  """Writes tensors as model.safetensors, or shards plus an index past `max_shard_bytes`.

  Files are written under temporary names and renamed at the end, so an interrupted save
  leaves no half-written checkpoint under the final names.
  """
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, x in tensors:
    if shards[-1] and size + x.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = x
    size += x.nbytes
  n = len(shards)
  names = [WEIGHTS_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
  final = []
  for name, shard in zip(names, shards):
    tmp = os.path.join(path, f".tmp.{name}")
    safetensors.numpy.save_file(shard, tmp, metadata={"format": "pt"})
    final.append((tmp, os.path.join(path, name)))
  if n > 1:
    weight_map = {t: name for name, shard in zip(names, shards) for t in shard}
    total = sum(x.nbytes for shard in shards for x in shard.values())
    tmp = os.path.join(path, f".tmp.{INDEX_FILE}")
    with open(tmp, "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    final.append((tmp, os.path.join(path, INDEX_FILE)))
  keep = {os.path.basename(dst) for _, dst in final}
  for f in os.listdir(path):  # weights of an earlier save would shadow or mix with ours
    if f not in keep and (f in (WEIGHTS_FILE, INDEX_FILE) or
                          (f.startswith("model-") and f.endswith(".safetensors"))):
      os.remove(os.path.join(path, f))
  for tmp, dst in final:
    os.replace(tmp, dst)
    os.chmod(dst, 0o644)  # an exported model is for others to read
