"""TrainState and the optimizer: what an RL step reads and writes.

The state is one pytree, sharded on the mesh, donated to every update step and saved
whole by the checkpoints. Reference parameters are not part of it: they are frozen,
travel separately, and never meet a gradient.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec

@struct.dataclass
class TrainState:
  """Everything an RL step changes.

  Attributes:
    step: RL steps completed (int32 scalar).
    policy_params, policy_opt: the policy and its optax state.
    value_params, value_opt: the critic and its optax state (None without a value model).
    rng: the run's root PRNG key (uint32 [2]); every use folds in the step.
    baselines: a stateful estimator's baselines (float32 [K], `rae`); None without one.
  """
  step: jax.Array
  policy_params: Any
  policy_opt: Any
  value_params: Any
  value_opt: Any
  rng: jax.Array
  baselines: Any = None


def make_schedule(opt_cfg, total_updates: int) -> optax.Schedule:
  """Linear warmup from 0 to `lr`, then constant or cosine decay to 0 at `total_updates`."""
  warmup = int(opt_cfg.warmup_steps)
  if opt_cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, opt_cfg.lr, warmup, max(total_updates, warmup + 1))
  if warmup == 0:
    return optax.constant_schedule(opt_cfg.lr)
  return optax.join_schedules([optax.linear_schedule(0.0, opt_cfg.lr, warmup),
                               optax.constant_schedule(opt_cfg.lr)], [warmup])


def make_optimizer(opt_cfg, schedule: optax.Schedule) -> optax.GradientTransformation:
  """AdamW with global-norm clipping, following `schedule` (from `make_schedule`).

  `opt_cfg`: a validated `config.optimizer` (`jaxrl_llm.config.validate`)."""
  parts = []
  if opt_cfg.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt_cfg.grad_clip_norm))
  parts.append(optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2,
                           eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay))
  return optax.chain(*parts)


def optimizer_shardings(optimizer: optax.GradientTransformation, abstract_params):
  """Where `optimizer.init(params)` lives: every leaf shaped like a parameter (AdamW's two
  moments) sharded like that parameter, the rest (step counts) replicated.

  Args:
    abstract_params: `jax.ShapeDtypeStruct`s of the parameters, with their shardings.
  """
  mesh = jax.tree.leaves(abstract_params)[0].sharding.mesh
  replicated = NamedSharding(mesh, PartitionSpec())
  abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
  return optax.tree_map_params(optimizer, lambda _, p: p.sharding, abstract_opt, abstract_params,
                               transform_non_params=lambda _: replicated)


def abstract_state(optimizer: optax.GradientTransformation, abstract_policy,
                   abstract_value=None, num_baselines: int = 0) -> TrainState:
  """The TrainState's shapes, dtypes and shardings, allocating nothing: the layout every
  step program, every fresh state and every restored checkpoint uses.

  Args:
    optimizer: the optax transformation of both the policy and the critic.
    abstract_policy, abstract_value: `jax.ShapeDtypeStruct`s (with shardings) of the
      policy's and the critic's parameters (`models.abstract_params`); no critic: None.
    num_baselines: K, the baselines a stateful estimator keeps (0: none).
  """
  mesh = jax.tree.leaves(abstract_policy)[0].sharding.mesh
  replicated = NamedSharding(mesh, PartitionSpec())

  def opt(params):
    if params is None:
      return None
    shapes = jax.eval_shape(optimizer.init, params)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                        optimizer_shardings(optimizer, params))

  scalar = lambda dtype, shape=(): jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)
  return TrainState(step=scalar(jnp.int32), policy_params=abstract_policy,
                    policy_opt=opt(abstract_policy), value_params=abstract_value,
                    value_opt=opt(abstract_value), rng=scalar(jnp.uint32, (2,)),
                    baselines=scalar(jnp.float32, (num_baselines,)) if num_baselines else None)


def shardings_of(tree):
  """The shardings of a tree of arrays or `jax.ShapeDtypeStruct`s."""
  return jax.tree.map(lambda x: x.sharding, tree)


def init_state(optimizer: optax.GradientTransformation, policy_params, value_params, seed: int,
               layout: TrainState) -> TrainState:
  """A fresh state in `layout` (`abstract_state`): the parameters as they are placed, the
  optimizer states created in the shardings of their parameters, the key replicated, the
  baselines (if any) zero."""
  shardings = shardings_of(layout)
  init = lambda params, out: None if params is None else jax.jit(
      optimizer.init, out_shardings=out)(params)
  return TrainState(
      step=jax.device_put(jnp.zeros((), jnp.int32), shardings.step),
      policy_params=policy_params, policy_opt=init(policy_params, shardings.policy_opt),
      value_params=value_params, value_opt=init(value_params, shardings.value_opt),
      rng=jax.device_put(jax.random.PRNGKey(seed), shardings.rng),
      baselines=None if layout.baselines is None else jax.device_put(
          jnp.zeros(layout.baselines.shape, jnp.float32), shardings.baselines))
