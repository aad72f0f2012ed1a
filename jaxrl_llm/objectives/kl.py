"""Per-token KL estimators between the policy and a reference (or any two policies).

For a token sampled from the policy, with `u = logp - ref_logp` (Schulman, "Approximating
KL Divergence", 2020, http://joschu.net/blog/kl-approx.html):

  k1 = u                          unbiased for KL(π‖π_ref), can be negative
  k2 = ½·u²                       biased, low variance, ≥ 0
  k3 = exp(-u) - (-u) - 1         unbiased, ≥ 0 (GRPO, Shao et al. 2024, arXiv:2402.03300)

Where the KL goes is `algo.kl.placement`: `loss` (β·KL added per token before the
loss aggregation, GRPO), `reward` (β·KL subtracted from token rewards before the
advantage, PPO-RLHF / RLOO / REINFORCE++) or `none`.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def k1(logp: Array, ref_logp: Array) -> Array:
  """`logp - ref_logp`."""
  return logp - ref_logp


def k2(logp: Array, ref_logp: Array) -> Array:
  """`½·(logp - ref_logp)²`."""
  return 0.5 * jnp.square(logp - ref_logp)


def k3(logp: Array, ref_logp: Array) -> Array:
  """`exp(ref_logp - logp) - (ref_logp - logp) - 1`, ≥ 0."""
  log_ratio = ref_logp - logp
  return jnp.exp(log_ratio) - log_ratio - 1.0


KL_ESTIMATORS: dict[str, Callable[[Array, Array], Array]] = {"k1": k1, "k2": k2, "k3": k3}


def kl_divergence(logp: Array, ref_logp: Array, estimator: str) -> Array:
  """Per-token estimate of KL(π‖π_ref) for tokens sampled from π.

  `k1 = logp - ref_logp`, `k2 = ½(logp - ref_logp)²`,
  `k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1` (Schulman 2020; k3 is GRPO's
  estimator, Shao et al. 2024, arXiv:2402.03300). `ref_logp` is data: its gradient is
  stopped; `logp` keeps its gradient. Not masked: multiply by the mask yourself.

  Args:
    logp: `[B, T]` (any shape) log-probs of the policy being trained.
    ref_logp: same shape, log-probs of the reference.
    estimator: `'k1'`, `'k2'` or `'k3'`.

  Returns:
    Per-token estimate, the shape of `logp`, float32.
  """
  if estimator not in KL_ESTIMATORS:
    raise ValueError(
        f"Unknown KL estimator {estimator!r}; valid: {sorted(KL_ESTIMATORS)}.")
  logp = jnp.asarray(logp, jnp.float32)
  ref_logp = jax.lax.stop_gradient(jnp.asarray(ref_logp, jnp.float32))
  return KL_ESTIMATORS[estimator](logp, ref_logp)
