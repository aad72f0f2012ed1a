"""Hugging Face checkpoints <-> our parameter tree.

Reads `config.json` plus `model.safetensors` or a sharded `model.safetensors.index.json`
from a directory, and writes the same layout back so that
`transformers.AutoModelForCausalLM.from_pretrained` loads it. Tensors are read through
memory maps, one layer at a time, straight into the model's stacked and fused layout (the
layout map below), so a process never holds two copies of the checkpoint. A gs://
directory is read from a local copy of it (`paths.local_copy`) and written file by file.
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

from jaxrl_llm import paths
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


# --- the layout map ------------------------------------------------------------------------------
# Our layers are stacked on a leading L axis (the model scans over it) and some of them fuse
# several HF tensors (the matmul layout, see `transformer`):
#   attn/qkv_proj/kernel [L, D, K, G + 2, Dh]  <- q_proj, k_proj, v_proj (per kv head: G query
#                                                 heads, its key, its value)
#   mlp/gate_up_proj/kernel [L, D, 2, F]      <- gate_proj, up_proj
#   an MoE layer's mlp/router [L, D, E]       <- gate (the router)
#                  mlp/gate_up_proj [L, E, D, 2, F], mlp/down_proj [L, E, F, D]
#                                              <- experts.{j}.(gate_proj|w1, up_proj|w3,
#                                                 down_proj|w2), or transformers 5's fused
#                                                 experts.gate_up_proj / experts.down_proj
# A model whose dense and MoE layers alternate has one stack per run ('layers_0', ...,
# `layer_places`).
# HF stores Linear weights as [out, in]; our kernels are [in..., out...].
Layer = dict[tuple[str, ...], np.ndarray]


def _linear_out(x: np.ndarray, n_in: int) -> np.ndarray:
  """Our kernel (first `n_in` dims the input) -> HF [out, in]."""
  return x.reshape(math.prod(x.shape[:n_in]), -1).T


def _moe_prefix(cfg: ModelConfig, fused_experts: bool = False) -> str:
  """Where an MoE layer's router and experts sit in HF names (transformers 5's fused
  layout calls Mixtral's `block_sparse_moe` `mlp` too)."""
  return "block_sparse_moe" if cfg.model_type == "mixtral" and not fused_experts else "mlp"


# HF's per-expert names (the checkpoints' format): (gate, up, down) under `experts.{j}.`.
_EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2"), "qwen3_moe": ("gate_proj", "up_proj", "down_proj")}


def _layer_hf_shapes(cfg: ModelConfig, kind: str = "dense",
                     fused_experts: bool = False) -> dict[str, tuple[int, ...]]:
  """HF tensor shapes of one layer, by name under `model.layers.{i}.`. An MoE layer's experts
  are one tensor each per expert, or with `fused_experts` transformers 5's in-memory layout
  (`mlp.experts.gate_up_proj` [E, 2F, D], `mlp.experts.down_proj` [E, D, F])."""
  D, F, H, K, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  shapes = {
      "input_layernorm.weight": (D,), "post_attention_layernorm.weight": (D,),
      "self_attn.q_proj.weight": (H * Dh, D), "self_attn.k_proj.weight": (K * Dh, D),
      "self_attn.v_proj.weight": (K * Dh, D), "self_attn.o_proj.weight": (D, H * Dh),
  }
  if kind == "moe":
    E, Fe, prefix = cfg.num_experts, cfg.moe_intermediate_size, _moe_prefix(cfg, fused_experts)
    shapes[f"{prefix}.gate.weight"] = (E, D)
    if fused_experts:
      shapes.update({f"{prefix}.experts.gate_up_proj": (E, 2 * Fe, D),
                     f"{prefix}.experts.down_proj": (E, D, Fe)})
    else:
      gate, up, down = _EXPERT_NAMES[cfg.model_type]
      for j in range(E):
        shapes.update({f"{prefix}.experts.{j}.{gate}.weight": (Fe, D),
                       f"{prefix}.experts.{j}.{up}.weight": (Fe, D),
                       f"{prefix}.experts.{j}.{down}.weight": (D, Fe)})
  else:
    shapes.update({"mlp.gate_proj.weight": (F, D), "mlp.up_proj.weight": (F, D),
                   "mlp.down_proj.weight": (D, F)})
  if cfg.qkv_bias:
    shapes.update({"self_attn.q_proj.bias": (H * Dh,), "self_attn.k_proj.bias": (K * Dh,),
                   "self_attn.v_proj.bias": (K * Dh,)})
  if cfg.o_bias:
    shapes["self_attn.o_proj.bias"] = (D,)
  if cfg.qk_norm:
    shapes.update({"self_attn.q_norm.weight": (Dh,), "self_attn.k_norm.weight": (Dh,)})
  if cfg.mlp_bias:
    shapes.update({"mlp.gate_proj.bias": (F,), "mlp.up_proj.bias": (F,), "mlp.down_proj.bias": (D,)})
  return shapes


def _experts_from_hf(hf: dict[str, np.ndarray], cfg: ModelConfig) -> Layer:
  """An MoE layer's router and experts -> ('mlp', 'router') [D, E], ('mlp', 'gate_up_proj')
  [E, D, 2, F], ('mlp', 'down_proj') [E, F, D]."""
  E, Fe = cfg.num_experts, cfg.moe_intermediate_size
  fused = "mlp.experts.gate_up_proj" in hf
  prefix = _moe_prefix(cfg, fused)
  if fused:  # [E, 2F, D]: gate rows, then up rows
    gate_up = hf[f"{prefix}.experts.gate_up_proj"].reshape(E, 2, Fe, -1).transpose(0, 3, 1, 2)
    down = hf[f"{prefix}.experts.down_proj"].transpose(0, 2, 1)
  else:
    g, u, d = _EXPERT_NAMES[cfg.model_type]
    w = lambda j, name: hf[f"{prefix}.experts.{j}.{name}.weight"]
    gate_up = np.stack([np.stack([w(j, g).T, w(j, u).T], axis=1) for j in range(E)])
    down = np.stack([w(j, d).T for j in range(E)])
  return {("mlp", "router"): hf[f"{prefix}.gate.weight"].T, ("mlp", "gate_up_proj"): gate_up,
          ("mlp", "down_proj"): down}


def _experts_to_hf(layer: Layer, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
  """Inverse of `_experts_from_hf`, in the checkpoints' per-expert format."""
  prefix, (g, u, d) = _moe_prefix(cfg), _EXPERT_NAMES[cfg.model_type]
  yield f"{prefix}.gate.weight", layer[("mlp", "router")].T
  gate_up, down = layer[("mlp", "gate_up_proj")], layer[("mlp", "down_proj")]
  for j in range(cfg.num_experts):
    yield f"{prefix}.experts.{j}.{g}.weight", gate_up[j, :, 0].T
    yield f"{prefix}.experts.{j}.{u}.weight", gate_up[j, :, 1].T
    yield f"{prefix}.experts.{j}.{d}.weight", down[j].T


def layer_from_hf(hf: dict[str, np.ndarray], cfg: ModelConfig, kind: str = "dense") -> Layer:
  """One layer's HF tensors (by name under `model.layers.{i}.`) -> our per-layer leaves."""
  D, F, H, K, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  G = H // K
  qkv = lambda q, k, v: np.concatenate([q.reshape(q.shape[:-1] + (K, G, Dh)),
                                        k.reshape(k.shape[:-1] + (K, 1, Dh)),
                                        v.reshape(v.shape[:-1] + (K, 1, Dh))], axis=-2)
  w = lambda name: hf[f"{name}.weight"]
  out: Layer = {
      ("input_norm", "scale"): w("input_layernorm"),
      ("post_attention_norm", "scale"): w("post_attention_layernorm"),
      ("attn", "qkv_proj", "kernel"): qkv(*(w(f"self_attn.{n}_proj").T for n in "qkv")),
      ("attn", "o_proj", "kernel"): w("self_attn.o_proj").T.reshape(H, Dh, D),
  }
  if kind == "moe":
    out.update(_experts_from_hf(hf, cfg))
  else:
    out[("mlp", "gate_up_proj", "kernel")] = np.stack([w("mlp.gate_proj").T, w("mlp.up_proj").T],
                                                      axis=1)
    out[("mlp", "down_proj", "kernel")] = w("mlp.down_proj").T
  if cfg.qkv_bias:
    out[("attn", "qkv_proj", "bias")] = qkv(*(hf[f"self_attn.{n}_proj.bias"] for n in "qkv"))
  if cfg.o_bias:
    out[("attn", "o_proj", "bias")] = hf["self_attn.o_proj.bias"]
  if cfg.qk_norm:
    out[("attn", "q_norm", "scale")] = w("self_attn.q_norm")
    out[("attn", "k_norm", "scale")] = w("self_attn.k_norm")
  if cfg.mlp_bias:
    out[("mlp", "gate_up_proj", "bias")] = np.stack([hf["mlp.gate_proj.bias"], hf["mlp.up_proj.bias"]])
    out[("mlp", "down_proj", "bias")] = hf["mlp.down_proj.bias"]
  return out


def layer_to_hf(layer: Layer, cfg: ModelConfig, kind: str = "dense") -> Iterator[tuple[str, np.ndarray]]:
  """Inverse of `layer_from_hf`: (name under `model.layers.{i}.`, HF tensor) pairs."""
  D, H, K, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  G = H // K
  split_qkv = lambda x: (x[..., :G, :], x[..., G:G + 1, :], x[..., G + 1:, :])
  yield "input_layernorm.weight", layer[("input_norm", "scale")]
  yield "post_attention_layernorm.weight", layer[("post_attention_norm", "scale")]
  for name, part in zip("qkv", split_qkv(layer[("attn", "qkv_proj", "kernel")])):
    yield f"self_attn.{name}_proj.weight", part.reshape(D, -1).T
  yield "self_attn.o_proj.weight", _linear_out(layer[("attn", "o_proj", "kernel")], 2)
  if kind == "moe":
    yield from _experts_to_hf(layer, cfg)
  else:
    gate_up = layer[("mlp", "gate_up_proj", "kernel")]
    yield "mlp.gate_proj.weight", gate_up[:, 0].T
    yield "mlp.up_proj.weight", gate_up[:, 1].T
    yield "mlp.down_proj.weight", _linear_out(layer[("mlp", "down_proj", "kernel")], 1)
  if cfg.qkv_bias:
    for name, part in zip("qkv", split_qkv(layer[("attn", "qkv_proj", "bias")])):
      yield f"self_attn.{name}_proj.bias", part.reshape(-1)
  if cfg.o_bias:
    yield "self_attn.o_proj.bias", layer[("attn", "o_proj", "bias")]
  if cfg.qk_norm:
    yield "self_attn.q_norm.weight", layer[("attn", "q_norm", "scale")]
    yield "self_attn.k_norm.weight", layer[("attn", "k_norm", "scale")]
  if cfg.mlp_bias:
    yield "mlp.gate_proj.bias", layer[("mlp", "gate_up_proj", "bias")][0]
    yield "mlp.up_proj.bias", layer[("mlp", "gate_up_proj", "bias")][1]
    yield "mlp.down_proj.bias", layer[("mlp", "down_proj", "bias")]


def layer_places(cfg: ModelConfig) -> list[tuple[str, int, str]]:
  """For each layer: (its stack's parameter name, its index in the stack, its kind)."""
  places = []
  for (kind, start, stop), name in zip(cfg.segments, cfg.stack_names):
    places.extend((name, i - start, kind) for i in range(start, stop))
  return places


def _top_entries(cfg: ModelConfig) -> list[tuple[tuple[str, ...], str, bool]]:
  """(our path, HF name, HF stores it transposed) of the tensors outside the layers."""
  e = [(("embed",), "model.embed_tokens.weight", False), (("final_norm", "scale"), "model.norm.weight", False)]
  if cfg.head == "value":  # a reward model's score head: one label, no bias
    e.append((("value_head", "kernel"), "score.weight", False))
  elif not cfg.tie_word_embeddings:
    e.append((("lm_head",), "lm_head.weight", True))
  return e


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
          f"the directory holds {sorted(paths.listdir(path))[:10]}")


def read_config(path: str) -> dict[str, Any]:
  if not paths.isdir(path):
    raise FileNotFoundError(f"model path {path!r} does not exist or is not a directory (expected "
                            f"a Hugging Face model directory, local or gs://, with {CONFIG_FILE} "
                            "and safetensors weights)")
  file = paths.join(path, CONFIG_FILE)
  if not paths.exists(file):
    raise FileNotFoundError(f"{path!r} has no {CONFIG_FILE}: not a Hugging Face model directory "
                            f"(it holds {sorted(paths.listdir(path))[:10]})")
  try:
    return json.loads(paths.read_text(file))
  except json.JSONDecodeError as e:
    raise ValueError(f"{file!r} is not valid JSON ({e})") from e


def check_model_dir(path: str) -> dict[str, Any]:
  """The `config.json` of `path`, after checking that safetensors weights sit beside it."""
  hf_config = read_config(path)
  if not any(paths.exists(paths.join(path, f)) for f in (WEIGHTS_FILE, INDEX_FILE)):
    raise FileNotFoundError(_no_weights(path))
  return hf_config


def tensor_names(path: str) -> set[str] | None:
  """The tensor names of a local model directory's safetensors (their headers only); None
  for a remote one (gs://), whose files would have to be copied first."""
  if paths.is_remote(path):
    return None
  return _SafetensorsDir(path).names()


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
  st = _SafetensorsDir(paths.local_copy(path))  # memory maps need local files
  if cfg.head != "lm" and "score.weight" not in st.entries:
    raise ValueError(f"checkpoint {path!r} has no score head (score.weight): a value head "
                     "loads from a sequence-classification checkpoint (a reward model); make "
                     "a critic from a language model with models.value_model(policy) instead")
  dtype = _NP_DTYPES[cfg.param_dtype]
  used = set()

  def read(name: str, expected: tuple[int, ...]) -> np.ndarray:
    if name not in st.entries:
      raise ValueError(f"checkpoint {path!r} has no tensor {name!r}, which the config "
                       f"(model_type={cfg.model_type!r}) needs")
    if st.shape(name) != tuple(expected):
      raise ValueError(f"tensor {name!r} in {path!r} has shape {list(st.shape(name))}; the "
                       f"config expects {list(expected)}")
    used.add(name)
    return np.asarray(st.get(name), dtype=dtype)

  D, V = cfg.hidden_size, cfg.vocab_size
  hf_top = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,), "lm_head.weight": (V, D),
            "score.weight": (1, D)}
  params: dict[str, Any] = {}
  for ours, hf, transposed in _top_entries(cfg):
    x = read(hf, hf_top[hf])
    _set(params, ours, np.ascontiguousarray(x.T) if transposed else x)
  if cfg.head == "value":
    params["value_head"] = {"kernel": params["value_head"]["kernel"][0], "bias": np.zeros((), dtype)}
  stacks: dict[str, Layer] = {}
  sizes = {name: stop - start for (_, start, stop), name in zip(cfg.segments, cfg.stack_names)}
  for i, (stack, j, kind) in enumerate(layer_places(cfg)):  # one layer at a time, stacked
    fused = f"model.layers.{i}.mlp.experts.gate_up_proj" in st.entries
    shapes = _layer_hf_shapes(cfg, kind, fused_experts=fused)
    hf = {name: read(f"model.layers.{i}.{name}", shape) for name, shape in shapes.items()}
    stacked = stacks.setdefault(stack, {})
    for leaf, x in layer_from_hf(hf, cfg, kind).items():
      if leaf not in stacked:
        stacked[leaf] = np.empty((sizes[stack],) + x.shape, dtype)
      stacked[leaf][j] = x
  for stack, stacked in stacks.items():
    for leaf, x in stacked.items():
      _set(params, (stack,) + leaf, x)
  extra = sorted(n for n in st.names() - used if not n.endswith(_IGNORED_SUFFIXES)
                 and not (cfg.tie_word_embeddings and n == "lm_head.weight"))
  if extra:
    raise ValueError(f"checkpoint {path!r} has {len(extra)} tensors the config "
                     f"(model_type={cfg.model_type!r}) does not use, e.g. {extra[:5]}")
  return params


def _leaves(tree: dict, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _leaves(value, prefix + (key,))
    else:
      yield prefix + (key,), value


# --- writing ----------------------------------------------------------------------------------
def hf_tensors(params: dict[str, Any], cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (HF name, host array) for every parameter, in HF layout."""
  for ours, hf, transposed in _top_entries(cfg):
    x = np.asarray(_get(params, ours))
    x = x[None] if hf == "score.weight" else x  # [1 label, D]; the head's bias stays 0
    yield hf, np.ascontiguousarray(x.T if transposed else x)
  stacks = {name: dict(_leaves(params[name])) for name in cfg.stack_names}
  for i, (stack, j, kind) in enumerate(layer_places(cfg)):
    layer = {leaf: np.asarray(x[j]) for leaf, x in stacks[stack].items()}
    for name, x in layer_to_hf(layer, cfg, kind):
      yield f"model.layers.{i}.{name}", np.ascontiguousarray(x)


def save_params(tensors: Iterator[tuple[str, np.ndarray]], path: str,
                max_shard_bytes: int = 5 * 2**30) -> None:
  """Writes tensors as model.safetensors, or shards plus an index past `max_shard_bytes`.

  Files are written under temporary names and renamed at the end (`paths.replace`: on
  gs://, one upload per file), so an interrupted save leaves no half-written file under
  the final names.
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
    tmp = paths.temp_file_for(paths.join(path, name))
    safetensors.numpy.save_file(shard, tmp, metadata={"format": "pt"})
    final.append((tmp, paths.join(path, name)))
  if n > 1:
    weight_map = {t: name for name, shard in zip(names, shards) for t in shard}
    total = sum(x.nbytes for shard in shards for x in shard.values())
    tmp = paths.temp_file_for(paths.join(path, INDEX_FILE))
    with open(tmp, "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    final.append((tmp, paths.join(path, INDEX_FILE)))
  keep = set(names) | ({INDEX_FILE} if n > 1 else set())
  earlier = paths.listdir(path) if paths.isdir(path) else []  # gs://: no objects yet
  for f in earlier:  # weights of an earlier save would shadow or mix with ours
    if f not in keep and (f in (WEIGHTS_FILE, INDEX_FILE) or
                          (f.startswith("model-") and f.endswith(".safetensors"))):
      paths.remove(paths.join(path, f))
  for tmp, dst in final:
    os.chmod(tmp, 0o644)  # an exported model is for others to read
    paths.replace(tmp, dst)
