"""DAPO's batch and reward shaping, and the sampler/trainer importance correction.

* Overlong shaping (`algo.overlong`): a graded length penalty added to the reward,
  and optionally no loss at all on truncated responses (`mask_truncated`).
* Dynamic sampling (`algo.dynamic_sampling`): keep only groups whose rewards are not
  all equal (the others have zero advantage and no gradient); the trainer samples more
  prompts until the batch is full, at most `max_rounds` rounds.
  Yu et al. 2025, "DAPO", arXiv:2503.14476, §3.2 and §3.4.
* Truncated importance sampling (`algo.tis_cap`): `min(exp(old_trainer - old_sampler),
  cap)` corrects for the sampler's log-probs differing from the trainer's (Yao et al.
  2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def overlong_penalty(lengths_B: Array, max_len: int, cache_len: int) -> Array:
  """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13).

  `0` if `|y| ≤ L_max - L_cache`, `((L_max - L_cache) - |y|) / L_cache` if
  `L_max - L_cache < |y| ≤ L_max`, `-1` beyond.

  Args:
    lengths_B: response lengths `|y|`.
    max_len: `L_max`.
    cache_len: `L_cache` (0: no graded zone, just -1 past `L_max`).

  Returns:
    `[B]` float32 penalties in `[-1, 0]`, to add to the rewards.
  """
  lengths_B = lengths_B.astype(jnp.float32)
  safe_len = max_len - cache_len
  graded_B = (safe_len - lengths_B) / max(cache_len, 1)
  return jnp.where(lengths_B <= safe_len, 0.0, jnp.where(lengths_B <= max_len, graded_B, -1.0))


def overlong_shaped_rewards(rewards_B: Array, lengths_B: Array, overlong_cfg) -> Array:
  """`rewards + overlong_penalty(...)` when `overlong_cfg.enabled`, else `rewards`."""
  rewards_B = rewards_B.astype(jnp.float32)
  if not overlong_cfg.enabled:
    return rewards_B
  return rewards_B + overlong_penalty(lengths_B, overlong_cfg.max_len, overlong_cfg.cache_len)


def drop_truncated(mask_BT: Array, truncated_B: Array) -> Array:
  """`mask_truncated`: zero the loss mask of responses cut off at the length limit."""
  return mask_BT * (1 - truncated_B.astype(mask_BT.dtype))[:, None]


def dynamic_sampling_keep(rewards_PG: Array) -> Array:
  """`[P]` bool: True for groups whose rewards are not all equal (DAPO §3.2)."""
  return jnp.max(rewards_PG, axis=1) != jnp.min(rewards_PG, axis=1)


def truncated_importance_weight(
    old_logp_trainer_BT: Array, old_logp_sampler_BT: Array, cap: float
) -> Array:
  """`min(exp(old_trainer - old_sampler), cap)` per token, stop-gradient.

  Multiply the advantages by this weight (`adv_BT * w_BT`): every trust region is
  positively homogeneous in A, so that equals weighting each token's policy loss.
  Masked positions are the caller's to mask (the loss masks them anyway).
  """
  log_w_BT = old_logp_trainer_BT.astype(jnp.float32) - old_logp_sampler_BT.astype(jnp.float32)
  return jax.lax.stop_gradient(jnp.minimum(jnp.exp(log_w_BT), cap))
