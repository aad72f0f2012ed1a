"""Models made from another `Model`: with LoRA adapters, with an int8 base, merged back to
a plain model, frozen for inference, and a critic on the policy's backbone.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import sharding as sh
from jaxrl_llm.models import lora, quant
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.model import Model, _boxed_init, param_shardings, place


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
