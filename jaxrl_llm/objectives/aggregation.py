"""How per-token losses `ℓ[b, t]` become one loss, exactly accumulable.

Every built-in aggregation is a weighted sum divided by a normaliser that spans the
whole minibatch:

  loss = Σ_{b,t} w[b,t]·ℓ[b,t] / D

| aggregation               | w[b,t]         | D                          | used by          |
|---------------------------|----------------|----------------------------|------------------|
| `token_mean`              | mask           | Σ_b L_b (tokens)           | DAPO, CISPO, PPO |
| `seq_mean_token_mean`     | mask / L_b     | #sequences                 | GRPO, GSPO, SAPO |
| `seq_mean_token_sum`      | mask           | #sequences                 | RLOO             |
| `seq_mean_token_sum_norm` | mask           | #sequences · norm_length   | Dr. GRPO         |

`w` depends only on its own sequence (`L_b = Σ_t mask[b,t]`), and `D` only on two
minibatch totals, the token count and the sequence count (`batch_counts`). So if the
trainer computes `counts = batch_counts(mask)` once over the WHOLE minibatch and
passes it to every piece, the loss of the minibatch is exactly the sum of the losses
of its pieces, and so is the gradient:

  * gradient accumulation: `counts` of the full minibatch, passed to each
    micro-batch; sum the micro-batch losses and gradients.
  * data parallelism with `shard_map`: `counts = psum(batch_counts(local_mask))`;
    `psum` the local losses and gradients. (Under plain `jit` with a sharded batch,
    `batch_counts` of the global array is already global.)

Without `counts`, the piece's own counts are used, which is right for an unsplit
minibatch. `#sequences` counts sequences with at least one valid token, so all-masked
rows (batch padding, responses dropped by `mask_truncated`) change nothing.

A user reducer named by `cfg.loss.reducer` (`"pkg.module:fn"`) replaces the table and
is called like the built-ins: `fn(loss_BT, mask_BT, counts, loss_cfg) -> scalar`.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrl_llm import import_path

Array = jax.Array
Counts = dict  # {"tokens": scalar, "sequences": scalar}, float32


def batch_counts(mask_BT: Array) -> Counts:
  """Token and sequence counts that the aggregations divide by.

  Returns:
    `{"tokens": Σ mask, "sequences": #{b : L_b > 0}}`, float32 scalars. Sum them (or
    `psum` them) over the pieces of a minibatch to get the minibatch's counts.
  """
  mask_BT = mask_BT.astype(jnp.float32)
  lengths_B = jnp.sum(mask_BT, axis=1)
  return {"tokens": jnp.sum(lengths_B),
          "sequences": jnp.sum((lengths_B > 0).astype(jnp.float32))}


def rows_mask(mask_BT: Array, weight_B1: Array) -> Array:
  """`mask_BT` on the rows whose weight is not 0: the tokens a weighted term trains on."""
  return mask_BT * (weight_B1 != 0).astype(mask_BT.dtype)


def loss_counts(mask_BT: Array, row_weights: dict[str, Array] | None = None) -> Counts:
  """`batch_counts(mask_BT)`, plus, for each per-row weighted term of a mixed run
  (`policy_loss`'s `row_weights`), the counts of its own rows under that term's name:
  each term is normalised over the tokens it trains on (prime-rl's
  `L = Σ ℓ_rl / N_rl + Σ ℓ_ce / N_ce + ...`)."""
  counts = batch_counts(mask_BT)
  for name, weight_B in (row_weights or {}).items():
    counts[name] = batch_counts(rows_mask(mask_BT.astype(jnp.float32),
                                          weight_B.astype(jnp.float32)[:, None]))
  return counts


def _divide(num: Array, den: Array) -> Array:
  """`num / den`, 0 when there is nothing to divide by."""
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def _masked_sum(loss_BT: Array, mask_BT: Array) -> Array:
  return jnp.sum(jnp.where(mask_BT > 0, loss_BT * mask_BT, 0.0))


def token_mean(loss_BT: Array, mask_BT: Array, counts: Counts, cfg=None) -> Array:
  """`Σ_{b,t} mask·ℓ / Σ_b L_b` (DAPO, Yu et al. 2025, arXiv:2503.14476)."""
  del cfg
  return _divide(_masked_sum(loss_BT, mask_BT), counts["tokens"])


def seq_mean_token_mean(loss_BT: Array, mask_BT: Array, counts: Counts, cfg=None) -> Array:
  """`(1/B) Σ_b (1/L_b) Σ_t mask·ℓ` (GRPO, Shao et al. 2024, arXiv:2402.03300)."""
  del cfg
  inv_length_B1 = _divide(1.0, jnp.sum(mask_BT, axis=1, keepdims=True))
  return _divide(_masked_sum(loss_BT * inv_length_B1, mask_BT), counts["sequences"])


def seq_mean_token_sum(loss_BT: Array, mask_BT: Array, counts: Counts, cfg=None) -> Array:
  """`(1/B) Σ_b Σ_t mask·ℓ`: one term per response (RLOO, Ahmadian et al. 2024)."""
  del cfg
  return _divide(_masked_sum(loss_BT, mask_BT), counts["sequences"])


def seq_mean_token_sum_norm(loss_BT: Array, mask_BT: Array, counts: Counts, cfg) -> Array:
  """`Σ_{b,t} mask·ℓ / (B · norm_length)` (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783)."""
  if not cfg.norm_length or cfg.norm_length <= 0:
    raise ValueError("seq_mean_token_sum_norm needs loss.norm_length > 0 "
                     "(usually sampling.max_new_tokens).")
  return _divide(_masked_sum(loss_BT, mask_BT), counts["sequences"] * cfg.norm_length)


Reducer = Callable[[Array, Array, Counts, object], Array]
AGGREGATIONS: dict[str, Reducer] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum": seq_mean_token_sum,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
}


def get_reducer(loss_cfg) -> Reducer:
  """The reducer `loss_cfg.reducer` names by import path, else `loss_cfg.aggregation`."""
  if loss_cfg.reducer:
    return import_path.load_function(loss_cfg.reducer)
  if loss_cfg.aggregation not in AGGREGATIONS:
    raise ValueError(f"Unknown loss aggregation {loss_cfg.aggregation!r}; "
                     f"valid: {list(AGGREGATIONS)}.")
  return AGGREGATIONS[loss_cfg.aggregation]


def masked_token_mean(x_BT: Array, mask_BT: Array, counts: Counts) -> Array:
  """`Σ mask·x / counts['tokens']`: a metric that sums exactly over pieces."""
  return token_mean(x_BT, mask_BT, counts)


def masked_min(x_BT: Array, mask_BT: Array) -> Array:
  """Minimum over valid entries (+inf if none: the identity of `min`)."""
  return jnp.min(jnp.where(mask_BT > 0, x_BT, jnp.inf))


def masked_max(x_BT: Array, mask_BT: Array) -> Array:
  """Maximum over valid entries (-inf if none: the identity of `max`)."""
  return jnp.max(jnp.where(mask_BT > 0, x_BT, -jnp.inf))
