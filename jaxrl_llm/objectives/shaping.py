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
* Behaviour masking (`algo.behaviour_mask`, IcePop-style): tokens (or whole responses)
  whose weight `w = exp(o - b)` against the recorded behaviour log-probs `b` falls
  outside `[low, high]` get no loss and leave the aggregation's counts (IcePop, from the
  Ling Team's Ring-1T report, 2025; the contract: docs/objectives.md).
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


BEHAVIOUR_MASK_LEVELS = ("off", "token", "sequence")


def behaviour_mask(old_logp_BT: Array, behaviour_logp_BT: Array, mask_BT: Array,
                   mask_cfg) -> tuple[Array, Array]:
  """IcePop-style masking of tokens whose behaviour weight is out of range.

  `w_t = exp(o_t - b_t)`, with `o` the proximal log-probs (the trainer's, at the start of
  the update) and `b` the behaviour log-probs the sampler recorded. Level `token` keeps a
  token iff `low <= w_t <= high`; level `sequence` keeps a whole response iff its
  geometric mean `exp(mean_t log w_t)` (over its valid tokens) is in `[low, high]`; `off`
  keeps everything. The result is the loss mask: masked tokens get no loss and leave
  `batch_counts`.

  Args:
    old_logp_BT: `o`, `[B, T]`.
    behaviour_logp_BT: `b`, `[B, T]`.
    mask_BT: `[B, T]`, 1 on valid completion tokens.
    mask_cfg: `config.algo.behaviour_mask` (`level`, `low`, `high`).

  Returns:
    `(mask_BT with the masked tokens zeroed, in mask_BT's dtype, masked_frac)`:
    `masked_frac` is the fraction of valid tokens masked (0 when there are none).
  """
  if mask_cfg.level not in BEHAVIOUR_MASK_LEVELS:
    raise ValueError(f"algo.behaviour_mask.level = {mask_cfg.level!r} is unknown; valid: "
                     f"{list(BEHAVIOUR_MASK_LEVELS)}.")
  valid_BT = mask_BT > 0
  if mask_cfg.level == "off":
    return mask_BT, jnp.zeros((), jnp.float32)
  log_w_BT = jnp.where(valid_BT, old_logp_BT.astype(jnp.float32)
                       - behaviour_logp_BT.astype(jnp.float32), 0.0)
  log_low, log_high = jnp.log(jnp.float32(mask_cfg.low)), jnp.log(jnp.float32(mask_cfg.high))
  if mask_cfg.level == "token":
    log_w = log_w_BT
  else:  # log of the geometric mean of the response's weights, broadcast over its tokens
    lengths_B1 = jnp.maximum(jnp.sum(valid_BT, axis=1, keepdims=True), 1).astype(jnp.float32)
    log_w = jnp.sum(log_w_BT, axis=1, keepdims=True) / lengths_B1 * jnp.ones_like(log_w_BT)
  keep_BT = (log_w >= log_low) & (log_w <= log_high)
  kept_BT = jax.lax.stop_gradient(jnp.where(keep_BT, mask_BT, jnp.zeros_like(mask_BT)))
  valid = jnp.sum(valid_BT.astype(jnp.float32))
  masked = jnp.sum((valid_BT & ~keep_BT).astype(jnp.float32))
  return kept_BT, jnp.where(valid > 0, masked / jnp.maximum(valid, 1.0), 0.0)
