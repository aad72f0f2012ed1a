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

SCHEDULES = ("constant", "cosine")
OPTIMIZERS = ("adamw",)


@struct.dataclass
class TrainState:
  """Everything an RL step changes.

  Attributes:
    step: RL steps completed (int32 scalar).
    policy_params, policy_opt: the policy and its optax state.
    value_params, value_opt: the critic and its optax state (None without a value model).
    rng: the run's root PRNG key (uint32 [2]); every use folds in the step.
  """
  step: jax.Array
  policy_params: Any
  policy_opt: Any
  value_params: Any
  value_opt: Any
  rng: jax.Array


def check_optimizer_config(opt_cfg) -> None:
  if opt_cfg.name not in OPTIMIZERS:
    raise ValueError(f"config.optimizer.name={opt_cfg.name!r}: expected one of {list(OPTIMIZERS)}")
  if not opt_cfg.lr > 0:
    raise ValueError(f"config.optimizer.lr={opt_cfg.lr}: expected a positive learning rate")
  if opt_cfg.schedule not in SCHEDULES:
    raise ValueError(f"config.optimizer.schedule={opt_cfg.schedule!r}: expected one of "
                     f"{list(SCHEDULES)}")
  if opt_cfg.warmup_steps < 0:
    raise ValueError(f"config.optimizer.warmup_steps={opt_cfg.warmup_steps}: expected >= 0")
  if opt_cfg.grad_clip_norm < 0:
    raise ValueError(f"config.optimizer.grad_clip_norm={opt_cfg.grad_clip_norm}: expected >= 0 "
                     "(0 = off)")
  if opt_cfg.weight_decay < 0:
    raise ValueError(f"config.optimizer.weight_decay={opt_cfg.weight_decay}: expected >= 0")


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
  """AdamW with global-norm clipping, following `schedule` (from `make_schedule`)."""
  check_optimizer_config(opt_cfg)
  parts = []
  if opt_cfg.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt_cfg.grad_clip_norm))
  parts.append(optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2,
                           eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay))
  return optax.chain(*parts)


def init_state(policy_params, value_params, optimizer, value_optimizer, seed: int) -> TrainState:
  """A fresh state; optimizer states are created jitted, sharded like their parameters."""
  init = jax.jit(lambda p: optimizer.init(p))
  value_opt = None if value_params is None else jax.jit(value_optimizer.init)(value_params)
  return TrainState(step=jnp.zeros((), jnp.int32), policy_params=policy_params,
                    policy_opt=init(policy_params), value_params=value_params,
                    value_opt=value_opt, rng=jax.random.PRNGKey(seed))
