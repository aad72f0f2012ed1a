"""Policy, reference and value models: one Flax decoder, several parameter trees.

```python
from jaxrl_llm import models
model = models.from_pretrained(path, dtype="float32")            # HF-format local directory
logits = models.compute_logits(model, input_ids, attention_mask)  # int [B, T] -> float32 [B, T, V]
models.save_pretrained(model, path)                               # transformers can load it
policy = models.with_lora(model, 16, 32, ("qkv_proj", "o_proj"), rng)  # LoRA adapters (`lora`)
models.save_adapter(policy, adapter_dir, path)                    # PEFT's format
```

A `Model` is a pytree: its parameters are the leaves, its `ModelConfig` (and the mesh and
sharding rules it is placed with) are static, so a `Model` can be passed to `jax.jit`.
"""
from __future__ import annotations

import functools
import json
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from flax import struct
from jax.sharding import Mesh

from jaxrl_llm import paths
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import kv_cache, load, lora, quant
from jaxrl_llm.models.config import ModelConfig, from_hf_dict, to_hf_dict
from jaxrl_llm.models.transformer import Transformer

__all__ = [
    "Model", "ModelConfig", "abstract_params", "compute_logits", "compute_values", "forward",
    "from_pretrained", "frozen", "frozen_params", "init", "init_cache", "merged", "place", "positions_from_mask",
    "quantize_base", "save_adapter", "save_pretrained", "unembed", "value_model", "with_lora",
]

init_cache = kv_cache.init_cache
# XLA options for every program that runs a model. Without excess precision a bf16 program
# rounds every op as written, so two programs that compute the same forward (the update's
# and the one that scores its old log-probs) agree bit for bit, and the sampler's decode
# agrees with both up to its own op order. With XLA's default, fusion decides which bf16
# intermediates stay float32, so the same forward rounds differently in two programs: enough
# for a narrow trust region (GSPO's) to clip part of a first pass, where the ratio is 1 by
# definition (README, "bf16", has the figures). No effect in float32.
COMPILER_OPTIONS = {"xla_allow_excess_precision": False}
# The parameter tree's layout; checkpoints record it. 2: layers stacked on a leading axis,
# fused q/k/v and gate/up kernels (1: one subtree per layer, one kernel per HF tensor).
PARAM_LAYOUT = 2


@struct.dataclass
class Model:
  """Parameters plus the static description needed to run them.

  Attributes:
    params: the parameter tree (host numpy or device arrays, possibly sharded).
    config: the architecture and numerics.
    mesh: the mesh the parameters are placed on (None: default device, no constraints).
    rules: the logical-axis rules used with `mesh`.
  """
  params: Any
  config: ModelConfig = struct.field(pytree_node=False)
  mesh: Mesh | None = struct.field(pytree_node=False, default=None)
  rules: tuple | None = struct.field(pytree_node=False, default=None)

  @property
  def module(self) -> Transformer:
    return Transformer(self.config, self.mesh, self.rules)


def _boxed_init(cfg: ModelConfig, rng: jax.Array):
  module = Transformer(cfg)
  tokens = jnp.zeros((1, 1), jnp.int32)
  return module.init(rng, tokens, tokens, jnp.ones((1, 1), jnp.int32))["params"]


def param_shardings(cfg: ModelConfig, mesh: Mesh, rules):
  """The NamedShardings of `cfg`'s parameters on `mesh`, from their logical axes."""
  abstract = jax.eval_shape(functools.partial(_boxed_init, cfg), jax.random.key(0))
  return nn.unbox(sh.infer_shardings(abstract, mesh, rules))


def abstract_params(cfg: ModelConfig, mesh: Mesh, rules):
  """`jax.ShapeDtypeStruct`s of `cfg`'s parameters, with their shardings on `mesh`: the
  layout of a placed model, allocating nothing."""
  abstract = nn.unbox(jax.eval_shape(functools.partial(_boxed_init, cfg), jax.random.key(0)))
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract,
                      param_shardings(cfg, mesh, rules))


def init(cfg: ModelConfig, rng: jax.Array, mesh: Mesh | None = None,
         rules=sh.DEFAULT_RULES) -> Model:
  """A randomly initialised model; with a mesh, its parameters are created already sharded."""
  if mesh is None:
    params = nn.unbox(jax.jit(functools.partial(_boxed_init, cfg))(rng))
    return Model(params, cfg)
  rules = sh.freeze_rules(rules)
  params, _ = sh.init_sharded(functools.partial(_boxed_init, cfg, rng), mesh, rules)
  return Model(params, cfg, mesh, rules)


def place(model: Model, mesh: Mesh, rules=sh.DEFAULT_RULES) -> Model:
  """The same model with its parameters sharded on `mesh` by `rules`."""
  rules = sh.freeze_rules(rules)
  params = sh.put(model.params, param_shardings(model.config, mesh, rules))
  return Model(params, model.config, mesh, rules)


def from_pretrained(path: str, dtype: str = "float32", *, param_dtype: str | None = None,
                    remat: str = "none", attention: str = "auto", mesh: Mesh | None = None,
                    rules=sh.DEFAULT_RULES) -> Model:
  """Loads a Hugging Face directory (config.json + safetensors).

  Args:
    path: the directory, local or gs:// (read from a local copy, `paths.local_copy`).
    dtype: compute dtype name ('float32', 'bfloat16', 'float16').
    param_dtype: parameter dtype name (default: `dtype`).
    remat: what the backward pass keeps of each layer ('none', 'dots', 'full').
    attention: the training attention kernel ('auto', 'xla', 'blockwise', 'cudnn', 'splash').
    mesh, rules: place the parameters on this mesh (default: keep them on the host as numpy
      arrays; jitted calls copy them to the default device).
  """
  cfg = from_hf_dict(load.read_config(path), dtype=dtype, param_dtype=param_dtype, remat=remat,
                     attention=attention)
  model = Model(load.load_params(path, cfg), cfg)
  return place(model, mesh, rules) if mesh is not None else model


def _host(x) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def save_pretrained(model: Model, path: str, *, max_shard_bytes: int = 5 * 2**30) -> None:
  """Writes `model` as a Hugging Face directory that transformers' Auto classes load.

  `path` is local or gs://.

  With several processes, every process must call this (the parameters are gathered);
  only process 0 writes.
  """
  if model.config.head != "lm":
    raise ValueError("only language models (head='lm') save to the Hugging Face format; "
                     "checkpoint a value model with the trainer's orbax checkpoints")
  model = merged(model)  # adapters added in, an int8 base dequantized
  hf_config = to_hf_dict(model.config)
  params = jax.tree.map(_host, model.params)
  if jax.process_index() != 0:
    return
  paths.makedirs(path)
  load.save_params(load.hf_tensors(params, model.config), path, max_shard_bytes)
  paths.write_atomic(paths.join(path, load.CONFIG_FILE), json.dumps(hf_config, indent=2))


def with_lora(model: Model, rank: int, alpha: float, targets: tuple[str, ...], rng: jax.Array,
              dropout: float = 0.0) -> Model:
  """`model` plus fresh LoRA adapters (`lora`; B = 0, so its outputs are unchanged) on the
  projections `targets`, created where the model is placed."""
  cfg = model.config.replace(lora_rank=rank, lora_alpha=float(alpha), lora_targets=tuple(targets),
                             lora_dropout=float(dropout))
  make = lambda: lora.split(_boxed_init(cfg, rng))[1]
  if model.mesh is None:
    adapters = nn.unbox(jax.jit(make)())
  else:
    adapters, _ = sh.init_sharded(make, model.mesh, model.rules)
  return model.replace(params=lora.join(model.params, adapters), config=cfg)


def quantize_base(model: Model) -> Model:
  """`model` with its layers' projection kernels stored in int8 (`quant`: QLoRA's base),
  in the shardings of the int8 layout."""
  cfg = model.config.replace(base_quant="int8")
  params = quant.quantize_params(model.params, cfg.stack_names)
  if model.mesh is not None:
    params = sh.put(params, param_shardings(cfg, model.mesh, model.rules))
  return model.replace(params=params, config=cfg)


@functools.partial(jax.jit, static_argnums=(1,))
def _merge(params, cfg: ModelConfig):
  return lora.merge(params, cfg)


def merged(model: Model) -> Model:
  """The model with its adapters added into the kernels and an int8 base dequantized (to
  the param dtype): a plain model, as exported; `model` itself when it is one already."""
  cfg = model.config
  if not cfg.has_lora and cfg.base_quant == "none":
    return model
  return model.replace(params=_merge(model.params, cfg), config=lora.merged_config(cfg))


def save_adapter(model: Model, path: str, base_model_name_or_path: str | None) -> None:
  """Writes `model`'s adapters in PEFT's format (adapter_config.json and
  adapter_model.safetensors, `lora`), for `peft.PeftModel.from_pretrained` onto the base
  at `base_model_name_or_path`. Every process calls it; process 0 writes."""
  if not model.config.has_lora:
    raise ValueError("save_adapter needs a model with LoRA adapters (models.with_lora)")
  adapters = jax.tree.map(_host, lora.split(model.params)[1])
  if jax.process_index() != 0:
    return
  paths.makedirs(path)
  paths.write_atomic(paths.join(path, lora.PEFT_WEIGHTS_FILE), safetensors.numpy.save(
      dict(lora.peft_tensors(adapters, model.config)), metadata={"format": "pt"}))
  paths.write_atomic(paths.join(path, lora.PEFT_CONFIG_FILE), json.dumps(
      lora.adapter_config(model.config, base_model_name_or_path), indent=2))


# Parameters the forward reads in float32 whatever the compute dtype (an MoE layer's router:
# `moe.MoeMlp`); `frozen` keeps them as they are.
FLOAT32_PARAMS = ("router",)


def frozen(model: Model) -> Model:
  """A copy of `model` for inference only (the reference, a teacher): its floating
  parameters in the compute dtype, but those the forward reads in float32 (`FLOAT32_PARAMS`).

  The forward casts every other parameter to the compute dtype before it uses it, so the
  copy computes the same outputs bit for bit, in half the memory of float32 weights under
  bf16 compute. Never an alias of `model`'s arrays (the train state's are donated). Takes
  placed arrays or `jax.ShapeDtypeStruct`s (an abstract model).
  """
  return model.replace(params=frozen_params(model.params, model.config.jnp_dtype))


def frozen_params(params, dtype):
  """`frozen`'s copy of a parameter tree: floating leaves in `dtype` but `FLOAT32_PARAMS`."""
  def one(path, x):
    keep = (not jnp.issubdtype(x.dtype, jnp.floating)
            or any(getattr(k, "key", None) in FLOAT32_PARAMS for k in path))
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, x.dtype if keep else dtype, sharding=x.sharding)
    return jnp.copy(x).astype(x.dtype if keep else dtype)
  return jax.tree_util.tree_map_with_path(one, params)


def value_model(policy: Model) -> Model:
  """A critic: the policy's backbone (copied) plus a zero-initialised scalar head."""
  cfg = policy.config.replace(head="value")
  head_init = jax.eval_shape(functools.partial(_boxed_init, cfg), jax.random.key(0))["value_head"]
  params = {k: v for k, v in policy.params.items() if k != "lm_head"}
  params["value_head"] = jax.tree.map(lambda x: np.zeros(x.value.shape, x.value.dtype),
                                      head_init, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  params = jax.tree.map(lambda x: x.copy() if isinstance(x, np.ndarray) else jnp.array(x), params)
  model = Model(params, cfg)
  return place(model, policy.mesh, policy.rules) if policy.mesh is not None else model


def positions_from_mask(mask_BT: jax.Array) -> jax.Array:
  """Position ids that ignore left padding: clip(cumsum(mask) - 1, 0)."""
  return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=-1) - 1, 0)


def forward(model: Model, tokens_BT, positions_BT, kv_mask_BS, cache=None, cache_index=0,
            return_hidden=False, rope=None, routing_BTLk=None, with_router=False,
            dropout_rng=None):
  """One call of the transformer (not jitted: call it inside your own jitted function).

  `rope`: the positions' (cos, sin) tables when the caller computes them itself.
  An MoE model: `routing_BTLk` replays recorded experts (int32 [B, T, MoE layers, k], -1:
  the live choice), and `with_router` adds its routing to the result
  (`transformer.routing_summary`; None for a dense model). `dropout_rng`: the key of the
  LoRA adapters' dropout (`ModelConfig.lora_dropout`; None: no dropout).
  Returns (logits [B, T, V] float32 | values [B, T] | hidden [B, T, D], new cache or None
  [, routing]).
  """
  rngs = None if dropout_rng is None else {"dropout": dropout_rng}
  return model.module.apply({"params": model.params}, tokens_BT, positions_BT, kv_mask_BS,
                            cache, cache_index, return_hidden, rope, routing_BTLk, with_router,
                            rngs=rngs)


def unembed(model: Model, hidden_BTD):
  """Final hidden states -> float32 logits (or values); for chunked log-prob computation."""
  return model.module.apply({"params": model.params}, hidden_BTD, method=Transformer.unembed)


def _check_inputs(input_ids, attention_mask):
  input_ids, attention_mask = jnp.asarray(input_ids), jnp.asarray(attention_mask)
  if input_ids.ndim != 2 or input_ids.shape != attention_mask.shape:
    raise ValueError(f"input_ids {input_ids.shape} and attention_mask {attention_mask.shape} "
                     "must both be [batch, length]")
  if not jnp.issubdtype(input_ids.dtype, jnp.integer):
    raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
  return input_ids.astype(jnp.int32), attention_mask.astype(jnp.int32)


@functools.partial(jax.jit, compiler_options=COMPILER_OPTIONS)
def _full_forward(model: Model, input_ids, attention_mask):
  out, _ = forward(model, input_ids, positions_from_mask(attention_mask), attention_mask)
  return out


def compute_logits(model: Model, input_ids, attention_mask) -> jax.Array:
  """Float32 next-token logits [B, T, V] of int tokens [B, T]; left padding is ignored."""
  if model.config.head != "lm":
    raise ValueError("compute_logits needs a language model (head='lm'); use compute_values")
  return _full_forward(model, *_check_inputs(input_ids, attention_mask))


def compute_values(model: Model, input_ids, attention_mask) -> jax.Array:
  """Float32 values [B, T] of a critic made by `value_model`."""
  if model.config.head != "value":
    raise ValueError("compute_values needs a value model; make one with models.value_model(policy)")
  return _full_forward(model, *_check_inputs(input_ids, attention_mask))
