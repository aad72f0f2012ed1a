"""Policy and value losses: importance ratios, trust regions, KL and entropy terms.

`policy_loss` composes four independent choices read from `config.algo`:

  ratio (`loss.ratio`)          token | sequence | sequence_token | none
  trust region (`loss.trust_region`)   clip | cispo | gmpo | sapo | dppo_tv | ipo | none
  KL to the reference (`kl`)    β·KL per token when `kl.placement == 'loss'`
  aggregation (`loss.aggregation`)     see `aggregation.py`

into per-token losses `ℓ = pg_coef·ℓ_pg + β·KL - entropy_coef·H`, each part reduced with
the same aggregation, plus a teacher's distillation term (`distillation.py`) when
`distill.coef > 0`. The returned value is a loss to MINIMISE (papers maximise).
`old_logp`, `ref_logp` and `advantages` are data (stop-gradient).

Ratio `none` has no importance weight: the surrogate is the REINFORCE form
`ℓ = -A·logp` (RLOO on-policy, SFT with A = 1), whose gradient `-A·∇logp` equals that
of `-ρ·A` at ρ = 1. Ratio `token`/`sequence` with trust region `none` is `-ρ·A`.

Exact accumulation: pass `counts=batch_counts(minibatch_mask)` computed over the
whole minibatch (summed/psummed over micro-batches and devices); then losses, their
gradients and every mean metric add up exactly over the pieces. `ratio_min` and
`ratio_max` combine with min/max instead.
"""
from __future__ import annotations

from typing import Callable
import warnings

import jax
import jax.numpy as jnp

from jaxrl_llm.objectives import aggregation
from jaxrl_llm.objectives import distillation
from jaxrl_llm.objectives import kl as kl_lib

Array = jax.Array
sg = jax.lax.stop_gradient


# ---------------------------------------------------------------- importance ratios


def token_ratio(log_ratio_BT: Array, mask_BT: Array) -> Array:
  """PPO's per-token ratio `ρ_t = exp(logp_t - old_logp_t)`."""
  del mask_BT
  return jnp.exp(log_ratio_BT)


def sequence_ratio(log_ratio_BT: Array, mask_BT: Array) -> Array:
  """GSPO's `s_b = exp(Σ_t mask·(logp - old_logp) / L_b)`, broadcast to `[B, T]`.

  Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, eq. 7.
  """
  lengths_B1 = jnp.maximum(jnp.sum(mask_BT, axis=1, keepdims=True), 1.0)
  mean_log_ratio_B1 = jnp.sum(log_ratio_BT * mask_BT, axis=1, keepdims=True) / lengths_B1
  return jnp.exp(mean_log_ratio_B1) * jnp.ones_like(log_ratio_BT)


def sequence_token_ratio(log_ratio_BT: Array, mask_BT: Array) -> Array:
  """GSPO-token's `s_{b,t} = sg[s_b]·exp(logp_t - sg[logp_t])` (arXiv:2507.18071, eq. 13).

  Its value is `s_b`; its gradient wrt `logp_t` is `s_b` for token t alone, so a
  token-level advantage weights its own token.
  """
  return sg(sequence_ratio(log_ratio_BT, mask_BT)) * jnp.exp(log_ratio_BT - sg(log_ratio_BT))


RATIOS: dict[str, Callable[[Array, Array], Array]] = {
    "token": token_ratio,
    "sequence": sequence_ratio,
    "sequence_token": sequence_token_ratio,
    "none": token_ratio,  # reported in metrics only; the loss uses -A·logp
}


# ---------------------------------------------------------------- trust regions
# Each: (ratio, adv, logp, log_ratio, mask, loss_cfg) -> (loss_BT, flags), where
# flags maps a metric name to a [B, T] 0/1 indicator (token-mean'ed into metrics).


def clip_loss(ratio, adv, logp, log_ratio, mask, cfg):
  """PPO clip: `-min(ρA, clip(ρ, 1-clip_low, 1+clip_high)·A)`.

  Schulman et al. 2017, arXiv:1707.06347; asymmetric "clip-higher" from DAPO
  (arXiv:2503.14476). `dual_clip = c > 1` (Ye et al. 2020, arXiv:1912.09729) also
  bounds the loss of A < 0 tokens by `-c·A`. A clipped token has zero gradient.
  """
  del logp, log_ratio, mask
  low, high = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
  loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, low, high) * adv)
  flags = {"clip_frac_low": (adv < 0) & (ratio < low),
           "clip_frac_high": (adv > 0) & (ratio > high)}
  if cfg.dual_clip > 0:
    bound = -cfg.dual_clip * adv
    flags["clip_frac_dual"] = (adv < 0) & (loss > bound)
    loss = jnp.where(adv < 0, jnp.minimum(loss, bound), loss)
  return loss, flags


def cispo_loss(ratio, adv, logp, log_ratio, mask, cfg):
  """CISPO: `-sg[clip(ρ, 1-clip_low, 1+clip_high)]·A·logp`.

  Chen et al. 2025, MiniMax-M1, arXiv:2506.13585, eq. 4. The importance weight is
  truncated and stop-gradient, so every token keeps its gradient `-w·A·∇logp`.
  `clip_low >= 1` means no lower bound (the paper's choice).
  """
  del log_ratio, mask
  low, high = max(1.0 - cfg.clip_low, 0.0), 1.0 + cfg.clip_high
  weight = sg(jnp.clip(ratio, low, high))
  flags = {"clip_frac_high": ratio > high}
  if low > 0:
    flags["clip_frac_low"] = ratio < low
  return -weight * adv * logp, flags


def gmpo_loss(ratio, adv, logp, log_ratio, mask, cfg):
  """GMPO: `-A·exp(mean_t pessimistic clip(log ρ_t, -clip_low, clip_high))`.

  Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673. The
  geometric mean of the token ratios of a response, each clipped in LOG space and the
  pessimistic side kept for the sign of A; one term per response, spread evenly over
  its tokens (so `seq_mean_token_mean` gives the mean over responses).
  """
  del ratio, logp
  sign = jnp.sign(adv)
  clipped = jnp.clip(log_ratio, -cfg.clip_low, cfg.clip_high)
  pessimistic = sign * jnp.minimum(sign * log_ratio, sign * clipped)
  lengths_B1 = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
  mean_B1 = jnp.sum(pessimistic * mask, axis=1, keepdims=True) / lengths_B1
  flags = {"clip_frac_low": (adv < 0) & (log_ratio < -cfg.clip_low),
           "clip_frac_high": (adv > 0) & (log_ratio > cfg.clip_high)}
  return -adv * jnp.exp(mean_B1), flags


def sapo_loss(ratio, adv, logp, log_ratio, mask, cfg):
  """SAPO soft gate: `-f(ρ)·A`, `f(ρ) = σ(τ(ρ-1))·4/τ`, τ = tau_pos (A>0) / tau_neg.

  Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347. The gradient
  weight `f'(ρ)·ρ = 4σ(1-σ)·ρ` is 1 at ρ = 1 and decays smoothly away from it.
  """
  del logp, log_ratio, mask
  tau = jnp.where(adv > 0, cfg.tau_pos, cfg.tau_neg)
  return -jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv, {}


def _prob_shift(logp, log_ratio):
  """`π_t - μ_t`: how far the sampled token's probability moved (stop-gradient)."""
  return sg(jnp.exp(logp) - jnp.exp(logp - log_ratio))


def dppo_tv_loss(ratio, adv, logp, log_ratio, mask, cfg):
  """prime-rl's default loss: DPPO-Binary-TV with a squared log-ratio term.

  `-keep·ρ·A + log_ratio_coef·(log ρ)²`, where a token is dropped from the first term
  when its probability moved too far in the direction its advantage pushes: `π - μ >
  prob_high` with A > 0, `π - μ < -prob_low` otherwise (probabilities, not ratios).
  The mask is a trust region in total variation (DPPO, arXiv:2602.04879); the squared
  log-ratio is Kimi K2.5's KL term (arXiv:2602.02276). As `default_loss_fn` in
  prime-rl's `src/prime_rl/trainer/rl/loss.py` (commit 559b447), whose defaults are
  0.2 / 0.2 / 1e-3.
  """
  del mask
  shift = _prob_shift(logp, log_ratio)
  too_high, too_low = shift > cfg.prob_high, shift < -cfg.prob_low
  masked = jnp.where(adv > 0, too_high, too_low)
  loss = -jnp.where(masked, 0.0, ratio * adv) + cfg.log_ratio_coef * jnp.square(log_ratio)
  flags = {"prob_mask_frac": masked,
           "prob_mask_frac_low": (adv < 0) & too_low,
           "prob_mask_frac_high": (adv > 0) & too_high}
  return loss, flags


def ipo_loss(ratio, adv, logp, log_ratio, mask, cfg):
  """prime-rl's IPO loss: a symmetric trust region in probability.

  `-1[-prob_low <= π - μ <= prob_high]·ρ·A + log_ratio_coef·(log ρ)²`, whatever the
  sign of A; prime-rl's `ipo_loss_fn` (same file and commit as `dppo_tv_loss`) masks
  `|π - μ| > ipo_threshold = 0.1`, which is `prob_low = prob_high = 0.1` here.
  """
  del mask
  shift = _prob_shift(logp, log_ratio)
  masked = (shift > cfg.prob_high) | (shift < -cfg.prob_low)
  loss = -jnp.where(masked, 0.0, ratio * adv) + cfg.log_ratio_coef * jnp.square(log_ratio)
  return loss, {"prob_mask_frac": masked}


def no_trust_region_loss(ratio, adv, logp, log_ratio, mask, cfg):
  """`-ρ·A` (vanilla importance-weighted policy gradient)."""
  del logp, log_ratio, mask, cfg
  return -ratio * adv, {}


TRUST_REGIONS = {
    "clip": clip_loss,
    "cispo": cispo_loss,
    "gmpo": gmpo_loss,
    "sapo": sapo_loss,
    "dppo_tv": dppo_tv_loss,
    "ipo": ipo_loss,
    "none": no_trust_region_loss,
}


def _lookup(table: dict, name: str, what: str):
  if name not in table:
    raise ValueError(f"Unknown {what} {name!r}; valid: {list(table)}.")
  return table[name]


# ---------------------------------------------------------------- policy loss


def policy_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    cfg,
    ref_logp: Array | None = None,
    entropy: Array | None = None,
    *,
    teacher_logp: Array | None = None,
    row_weights: dict[str, Array] | None = None,
    counts: aggregation.Counts | None = None,
) -> tuple[Array, dict[str, Array]]:
  """The policy-gradient loss of any preset, as a loss to minimise.

  `ℓ_pg[b,t]` from `cfg.loss.ratio` and `cfg.loss.trust_region` (see the functions
  above), plus `β·kl_divergence(logp, ref_logp, cfg.kl.estimator)` when
  `cfg.kl.placement == 'loss'` and `cfg.kl.coef = β > 0`, minus
  `cfg.loss.entropy_coef·entropy`; each part reduced by `cfg.loss.aggregation` (or the
  user reducer `cfg.loss.reducer`) with the normalisers in `counts`.

  Args:
    logp: `[B, T]` log-probs of the sampled tokens under the current policy.
    old_logp: `[B, T]` log-probs under the behaviour policy (stop-gradient).
    advantages: `[B]` (one per response) or `[B, T]` (stop-gradient).
    mask: `[B, T]`, 1 on valid completion tokens.
    cfg: `config.algo`, read at trace time (close over it or use `functools.partial`).
    ref_logp: `[B, T]` reference log-probs; with the KL in the loss and no
      `ref_logp`, the KL term is left out (with a warning at trace time).
    entropy: `[B, T]` per-token entropy of the policy; needed if `entropy_coef != 0`.
    teacher_logp: `[B, T]` a teacher's log-probs of the sampled tokens: with
      `cfg.distill.coef > 0` the distillation term `distillation.reverse_kl_loss` is
      added, times that coefficient (`distill_loss`).
    row_weights: a mixed run's per-row coefficients (`jaxrl_llm.config.sources`), `[B]`
      each: `'pg'` replaces `cfg.loss.pg_coef` and `'distill'` `cfg.distill.coef`. As in
      prime-rl, each term is then normalised over its own rows' tokens and sequences
      (the rows whose coefficient is not 0): `L = Σ ℓ_pg / N_pg + Σ ℓ_distill / N_distill
      + ...` (`aggregation.loss_counts`).
    counts: `loss_counts(mask, row_weights)` of the WHOLE minibatch when this call sees
      only a piece of it (micro-batch or device shard); defaults to this call's own counts.

  Returns:
    `(loss, metrics)`. `metrics` holds scalars: `pg_loss` (times `cfg.loss.pg_coef`;
    0 and no trust-region metrics when that is 0), `kl_loss`, `entropy_loss` and, with
    a distillation term, `distill_loss` (they sum to `loss`); `approx_kl` (k3 of new vs old, token mean);
    `ratio_mean`, `ratio_min`, `ratio_max` (of the ratio the loss uses); `clip_frac`
    for clip/cispo/gmpo, with `clip_frac_low` and `clip_frac_high` where both bounds
    apply and `clip_frac_dual` with a dual clip (fractions of valid tokens whose
    clipped branch is the active one); `prob_mask_frac` for dppo_tv/ipo (with
    `_low`/`_high` for dppo_tv); `entropy` when `entropy` is given; `kl_ref`
    when `ref_logp` is given.
  """
  loss_cfg = cfg.loss
  mask = mask.astype(jnp.float32)
  valid = mask > 0
  # Padding positions may hold anything (even -inf): zero them before any exp.
  logp = jnp.where(valid, logp.astype(jnp.float32), 0.0)
  old_logp = jnp.where(valid, sg(old_logp.astype(jnp.float32)), 0.0)
  adv = sg(jnp.asarray(advantages, jnp.float32))
  if adv.ndim == 1:
    adv = adv[:, None] * jnp.ones_like(mask)
  adv = jnp.where(valid, adv, 0.0)
  row_weights = row_weights or {}
  counts = aggregation.loss_counts(mask, row_weights) if counts is None else counts
  reduce = aggregation.get_reducer(loss_cfg)

  log_ratio = logp - old_logp
  ratio = _lookup(RATIOS, loss_cfg.ratio, "importance ratio")(log_ratio, mask)
  pg_loss, flags = _pg_term(logp, log_ratio, ratio, adv, mask, counts, loss_cfg, reduce,
                            row_weights.get("pg"))
  metrics = {"pg_loss": pg_loss}
  metrics.update(_kl_and_entropy_terms(logp, ref_logp, entropy, valid, mask, counts, cfg, reduce))
  metrics.update(_distillation_term(logp, old_logp, teacher_logp, mask, counts, cfg,
                                    row_weights.get("distill")))
  loss = sum(metrics[k] for k in ("pg_loss", "kl_loss", "entropy_loss", "distill_loss")
             if k in metrics)
  metrics.update(_ratio_diagnostics(log_ratio, ratio, flags, mask, counts))
  return loss, metrics


def _pg_term(logp, log_ratio, ratio, adv, mask, counts, loss_cfg, reduce, row_weight_B=None):
  """(the policy-gradient term, its trust region's flags): `cfg.loss.pg_coef` (or a mixed
  run's per-row weights, normalised over their rows) times the reduced `ℓ_pg`; 0 and no
  flags when the coefficient is 0 (pure distillation: no advantage read)."""
  trust_region = _lookup(TRUST_REGIONS, loss_cfg.trust_region, "trust region")
  if loss_cfg.ratio == "none" and loss_cfg.trust_region != "none":
    raise ValueError(f"Ratio 'none' needs trust_region 'none', got {loss_cfg.trust_region!r}.")
  if loss_cfg.pg_coef == 0 and row_weight_B is None:
    return jnp.zeros((), jnp.float32), {}
  flags = {}
  if loss_cfg.ratio == "none":
    pg_BT = -adv * logp
  else:
    pg_BT, flags = trust_region(ratio, adv, logp, log_ratio, mask, loss_cfg)
  if row_weight_B is None:
    return loss_cfg.pg_coef * reduce(pg_BT, mask, counts, loss_cfg), flags
  weight_B1 = row_weight_B.astype(jnp.float32)[:, None]
  return reduce(weight_B1 * pg_BT, aggregation.rows_mask(mask, weight_B1), counts["pg"],
                loss_cfg), flags


def _distillation_term(logp, old_logp, teacher_logp, mask, counts, cfg,
                       weight_B=None) -> dict[str, Array]:
  """`distill_loss` (`cfg.distill.coef`, or each row's `weight_B`, times `reverse_kl_loss`)
  and its mask fraction; nothing when the term is off."""
  if cfg.distill.coef == 0 and weight_B is None:
    return {}
  if teacher_logp is None:
    raise ValueError("a distillation term (algo.distill.coef > 0) needs the teacher's log-probs "
                     "(teacher_logp); got None.")
  if weight_B is not None:
    weight_B1 = weight_B.astype(jnp.float32)[:, None]
    loss, metrics = distillation.reverse_kl_loss(
        logp, old_logp, teacher_logp, aggregation.rows_mask(mask, weight_B1), cfg,
        counts=counts["distill"], row_weight=weight_B1)
    return dict(metrics, distill_loss=loss)
  loss, metrics = distillation.reverse_kl_loss(logp, old_logp, teacher_logp, mask, cfg,
                                               counts=counts)
  return dict(metrics, distill_loss=cfg.distill.coef * loss)


def _kl_and_entropy_terms(logp, ref_logp, entropy, valid, mask, counts, cfg,
                          reduce) -> dict[str, Array]:
  """`kl_loss` and `entropy_loss` (0 when off), and the `kl_ref` and `entropy` metrics."""
  loss_cfg = cfg.loss
  zero = jnp.zeros((), jnp.float32)
  metrics = {"kl_loss": zero, "entropy_loss": zero}
  if ref_logp is not None:
    ref_logp = jnp.where(valid, sg(ref_logp.astype(jnp.float32)), 0.0)
    kl_BT = kl_lib.kl_divergence(logp, ref_logp, cfg.kl.estimator)
    metrics["kl_ref"] = aggregation.masked_token_mean(sg(kl_BT), mask, counts)
  if cfg.kl.placement == "loss" and cfg.kl.coef > 0:
    if ref_logp is None:
      # Lenient for callers that only look at the policy-gradient part; the trainer
      # always passes ref_logp when the KL is in the loss.
      warnings.warn("kl.placement == 'loss' with kl.coef > 0 but no ref_logp: "
                    "the KL term is left out.", stacklevel=3)
    else:
      metrics["kl_loss"] = reduce(cfg.kl.coef * kl_BT, mask, counts, loss_cfg)
  if entropy is not None:
    entropy = jnp.where(valid, entropy.astype(jnp.float32), 0.0)
    metrics["entropy"] = aggregation.masked_token_mean(sg(entropy), mask, counts)
    metrics["entropy_loss"] = reduce(-loss_cfg.entropy_coef * entropy, mask, counts,
                                     loss_cfg)
  elif loss_cfg.entropy_coef != 0:
    raise ValueError("loss.entropy_coef != 0 needs the per-token entropy.")
  return metrics


def _ratio_diagnostics(log_ratio, ratio, flags, mask, counts) -> dict[str, Array]:
  """`approx_kl`, the ratio's mean/min/max and the clip fractions, all stop-gradient."""
  log_ratio = sg(log_ratio)  # k3 of KL(old‖new) on tokens sampled from old:
  approx_kl_BT = jnp.exp(log_ratio) - log_ratio - 1.0  # ρ - log ρ - 1
  ratio = sg(ratio)
  metrics = {"approx_kl": aggregation.masked_token_mean(approx_kl_BT, mask, counts),
             "ratio_mean": aggregation.masked_token_mean(ratio, mask, counts),
             "ratio_min": aggregation.masked_min(ratio, mask),
             "ratio_max": aggregation.masked_max(ratio, mask)}
  for name, flag in flags.items():
    metrics[name] = aggregation.masked_token_mean(flag.astype(jnp.float32), mask, counts)
  if "clip_frac_high" in flags:
    metrics["clip_frac"] = sum(metrics[k] for k in ("clip_frac_low", "clip_frac_high")
                               if k in flags)
    if "clip_frac_low" not in flags:  # only one bound: report it as clip_frac alone
      del metrics["clip_frac_high"]
  return metrics


# ---------------------------------------------------------------- value loss


def value_loss(
    values: Array,
    old_values: Array,
    returns: Array,
    mask: Array,
    cfg,
    *,
    counts: aggregation.Counts | None = None,
) -> tuple[Array, dict[str, Array]]:
  """PPO's clipped value loss, token mean, before `cfg.value.coef`.

  `½·max((V - Ret)², (V_old + clip(V - V_old, ±value_clip) - Ret)²)`; `value_clip = 0`
  turns the clip off (`½·(V - Ret)²`). Schulman et al. 2017, arXiv:1707.06347; the
  clipped form as in OpenAI baselines / TRL.

  Args:
    values: `[B, T]` current value predictions.
    old_values: `[B, T]` value predictions at sampling time (stop-gradient).
    returns: `[B, T]` targets, e.g. from `gae` (stop-gradient).
    mask: `[B, T]`.
    cfg: `config.algo`.
    counts: whole-minibatch `batch_counts`, as in `policy_loss`.

  Returns:
    `(loss, metrics)` with `value_clip_frac` (tokens whose clipped error is the larger),
    `value_mean` and `value_error` (token mean of `(V - Ret)²`).
  """
  mask = mask.astype(jnp.float32)
  valid = mask > 0
  values = jnp.where(valid, values.astype(jnp.float32), 0.0)
  old_values = jnp.where(valid, sg(old_values.astype(jnp.float32)), 0.0)
  returns = jnp.where(valid, sg(returns.astype(jnp.float32)), 0.0)
  counts = aggregation.batch_counts(mask) if counts is None else counts
  error = jnp.square(values - returns)
  clip = cfg.value.value_clip
  if clip > 0:
    clipped_values = old_values + jnp.clip(values - old_values, -clip, clip)
    clipped_error = jnp.square(clipped_values - returns)
    loss_BT = 0.5 * jnp.maximum(error, clipped_error)
    clip_frac = aggregation.masked_token_mean(
        (clipped_error > error).astype(jnp.float32), mask, counts)
  else:
    loss_BT = 0.5 * error
    clip_frac = jnp.zeros((), jnp.float32)
  metrics = {
      "value_clip_frac": clip_frac,
      "value_mean": aggregation.masked_token_mean(sg(values), mask, counts),
      "value_error": aggregation.masked_token_mean(sg(error), mask, counts),
  }
  return aggregation.token_mean(loss_BT, mask, counts), metrics
