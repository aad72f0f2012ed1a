"""The `Model` pytree and its parameters: random init, their abstract layout, placement.

A `Model` is a pytree: its parameters are the leaves, its `ModelConfig` (and the mesh and
sharding rules it is placed with) are static, so a `Model` can be passed to `jax.jit`.
"""
from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh

from jaxrl_llm import sharding as sh
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.transformer import Transformer

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
