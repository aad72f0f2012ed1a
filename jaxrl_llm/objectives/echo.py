"""echo (prime-rl `src/prime_rl/orchestrator/algo/echo.py`): learn to predict what the
environment inserts.

In a multi-turn episode the RL loss trains the model's own tokens; the tokens the
environment inserted (tool outputs, a user's feedback) carry no RL loss. echo adds a
cross-entropy term on the environment's tokens of chosen roles, each role at its own
weight alpha_role (`config.algo.echo = {"tool": 0.1}`: prime-rl's vetted default):

  L_echo = Σ_{b,t} w[b,t] · (-log π(o_t)) / N_echo,   w[b,t] = alpha_role(b,t) (0 elsewhere)

normalised over its own token count N_echo = #{(b,t) : w[b,t] != 0} of the whole minibatch
(prime-rl's `L = Σ ℓ_rl / N_rl + Σ ℓ_ce / N_ce`), so the two terms do not dilute each
other. As in prime-rl, only environment tokens after the model's first turn are chosen
(the opening prompt is not), and a chosen token stays out of the RL mask.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def echo_weights(roles_BT: Array, alphas: dict[int, float]) -> Array:
  """`w[b,t]`: the weight of each token's role id (`alphas`: role id -> alpha), 0 for the
  other roles."""
  w_BT = jnp.zeros(roles_BT.shape, jnp.float32)
  for role, alpha in alphas.items():
    w_BT = jnp.where(roles_BT == role, jnp.float32(alpha), w_BT)
  return w_BT


def echo_count(weights_BT: Array) -> Array:
  """N_echo of this piece of a minibatch: the tokens with a weight (sum over pieces)."""
  return jnp.sum((weights_BT != 0).astype(jnp.float32))


def echo_loss(logp_BT: Array, weights_BT: Array, count: Array | None = None
              ) -> tuple[Array, dict[str, Array]]:
  """`L_echo` and its metrics.

  Args:
    logp_BT: `[B, T]` log-probs of the tokens under the current policy (the gradient flows).
    weights_BT: `[B, T]` alpha of each environment token's role, 0 elsewhere (stop-gradient).
    count: N_echo of the WHOLE minibatch when this call sees a piece of it (default: this
      call's own `echo_count`).
  Returns:
    `(loss, {"echo_loss", "echo_nll"})`: the term, and the unweighted mean negative
    log-likelihood of the chosen tokens (0 when there are none).
  """
  w_BT = jax.lax.stop_gradient(weights_BT.astype(jnp.float32))
  chosen = w_BT != 0
  count = echo_count(w_BT) if count is None else count
  nll_BT = jnp.where(chosen, -logp_BT.astype(jnp.float32), 0.0)  # padding may hold -inf
  safe = jnp.where(count > 0, count, 1.0)
  loss = jnp.where(count > 0, jnp.sum(w_BT * nll_BT) / safe, 0.0)
  nll = jnp.where(count > 0, jax.lax.stop_gradient(jnp.sum(nll_BT)) / safe, 0.0)
  return loss, {"echo_loss": loss, "echo_nll": nll}
