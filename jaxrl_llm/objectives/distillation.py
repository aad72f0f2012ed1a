"""On-policy distillation: a teacher's log-probs of the policy's own samples as the signal.

The policy samples; a frozen teacher scores each completion by prefill, giving
`teacher_logp[b, t] = log π_T(y_t)`. Two ways to learn from it, both per token:

* A loss term (`algo.distill.coef`, prime-rl's `opd`): REINFORCE with the per-token
  negative reverse KL `sg(log π_T - log π)` as the reward, importance-weighted by
  `ρ = π / μ`, a one-sided trust region and a squared log-ratio term
  (`reverse_kl_loss`). No advantage is read; the group size only fans out sampling.
* Advantage shaping (`algo.distill.shaping_coef`, miles' `opd_kl_coef`): any
  estimator's advantage minus `λ·(old_logp - teacher_logp)` per token
  (`shaped_advantages`), so a GRPO run can also distil.

Both need only the sampled token's log-prob under the teacher, so the teacher may be
another size or family as long as it shares the tokenizer.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.objectives import aggregation

Array = jax.Array
sg = jax.lax.stop_gradient


def reverse_kl_loss(logp: Array, old_logp: Array, teacher_logp: Array, mask: Array, cfg, *,
                    counts: aggregation.Counts | None = None,
                    row_weight: Array | None = None) -> tuple[Array, dict[str, Array]]:
  """prime-rl's on-policy distillation loss, token mean over the valid tokens.

  Per token `ℓ_t = -m_t·sg(log π_T - log π)·ρ_t + c·(log ρ_t)²` with `ρ_t = exp(logp -
  old_logp)`, `m_t = 0` where the token's probability fell by more than `mask_low`
  (`π - μ < -mask_low`) and `c = log_ratio_coef`. `ref_kl_loss_fn` in prime-rl's
  `src/prime_rl/trainer/rl/loss.py` (commit 559b447) with its constants 0.2 and 1e-3 as
  the defaults of `config.algo.distill`. Its gradient is `-m_t·(log π_T - log π)·ρ_t·
  ∇log π + 2c·log ρ_t·∇log π`: on the first pass (ρ = 1) the policy gradient of the
  negative reverse KL `E_π[log π_T - log π]` with the teacher's log-ratio as the reward.

  Args:
    logp: `[B, T]` log-probs of the sampled tokens under the current policy.
    old_logp: `[B, T]` the behaviour log-probs `log μ` (stop-gradient).
    teacher_logp: `[B, T]` the teacher's (stop-gradient).
    mask: `[B, T]`, 1 on the tokens this term trains on.
    cfg: `config.algo` (reads `distill.mask_low`, `distill.log_ratio_coef`).
    counts: whole-minibatch `batch_counts(mask)`, as in `policy_loss`.
    row_weight: `[B, 1]` each row's coefficient (a mixed run's sources), or None.

  Returns:
    `(loss, metrics)`: `distill_mask_frac`, the fraction of valid tokens masked.
  """
  mask = mask.astype(jnp.float32)
  valid = mask > 0
  counts = aggregation.batch_counts(mask) if counts is None else counts
  logp = jnp.where(valid, logp.astype(jnp.float32), 0.0)
  old_logp = jnp.where(valid, sg(old_logp.astype(jnp.float32)), 0.0)
  teacher_logp = jnp.where(valid, sg(teacher_logp.astype(jnp.float32)), 0.0)
  log_ratio = logp - old_logp
  masked = sg(jnp.exp(logp) - jnp.exp(old_logp)) < -cfg.distill.mask_low
  signal = sg(teacher_logp - logp)
  loss_BT = (-jnp.where(masked, 0.0, signal * jnp.exp(log_ratio))
             + cfg.distill.log_ratio_coef * jnp.square(log_ratio))
  if row_weight is not None:
    loss_BT = row_weight * loss_BT
  metrics = {"distill_mask_frac": aggregation.masked_token_mean(masked.astype(jnp.float32),
                                                                 mask, counts)}
  return aggregation.token_mean(loss_BT, mask, counts), metrics


def shaped_advantages(advantages_BT: Array, old_logp: Array, teacher_logp: Array, mask: Array,
                      coef: float) -> Array:
  """miles' on-policy distillation as advantage shaping: `A_t - coef·(old_logp_t -
  teacher_logp_t)`, zero off the mask.

  `apply_opd_kl_to_advantages` in miles' `miles/backends/training_utils/loss_hub/opd.py`
  (commit 31f1ca9; `opd_kl_coef`, 1.0 by default there): the per-token reverse KL of the
  student that sampled against the teacher, taken off whatever the estimator gave.
  """
  reverse_kl_BT = old_logp.astype(jnp.float32) - teacher_logp.astype(jnp.float32)
  return sg(jnp.where(mask > 0, advantages_BT - coef * reverse_kl_BT, 0.0))


def reverse_kl(old_logp: Array, teacher_logp: Array, mask: Array) -> Array:
  """`mean_t (log μ - log π_T)` over the valid tokens: the sampled estimate of the policy's
  reverse KL to the teacher per token (logged as `distill/reverse_kl`)."""
  diff = jnp.where(mask > 0, old_logp.astype(jnp.float32) - teacher_logp.astype(jnp.float32),
                   0.0)
  return aggregation.token_mean(diff, mask, aggregation.batch_counts(mask))
