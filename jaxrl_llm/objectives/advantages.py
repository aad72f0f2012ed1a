"""Advantage estimators: outcome (group) baselines, REINFORCE++ returns, and GAE.

Layout: P prompts × G responses; sequence `b = p·G + g` (group-major), so
`rewards_PG.reshape(-1)` lines up with the rows of every `[B, T]` array.

Two entry points:
  * `outcome_advantages(rewards_PG, cfg) -> adv_PG` for the response-level
    estimators (`grpo`, `dr_grpo`, `rloo`, `max_rl`, `reinforce_pp_baseline`,
    `constant`), or a user function named by `cfg.advantage.fn`.
  * `token_advantages(rewards_PG, mask_BT, cfg, ...) -> (adv_BT, returns_BT)` for
    every estimator, including the token-level ones (`reinforce_pp`, `gae`), with
    KL-in-reward applied when `cfg.kl.placement == 'reward'`.

Rewards, values and reference log-probs are data: every output is stop-gradient.
A group whose rewards are all equal gets exactly zero advantage (never NaN).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import import_path
from jaxrl_llm.objectives import kl as kl_lib

Array = jax.Array

GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "max_rl", "reinforce_pp_baseline")
TOKEN_ESTIMATORS = ("reinforce_pp", "gae")
STATEFUL_ESTIMATORS = ("rae",)  # baselines carried from step to step (training state)
SCALES = ("group", "batch", "none")


# ---------------------------------------------------------------- outcome estimators


def _check_group(rewards_PG: Array, name: str) -> None:
  if rewards_PG.ndim != 2 or rewards_PG.shape[1] < 2:
    raise ValueError(
        f"{name} advantages need rewards [P, G] with G >= 2, got {rewards_PG.shape}.")


def _centered(rewards_PG: Array) -> tuple[Array, Array]:
  """`(R - mean_g, equal_P)`, with exact zeros for groups whose rewards are all equal."""
  rewards_PG = jax.lax.stop_gradient(rewards_PG.astype(jnp.float32))
  equal_P = jnp.max(rewards_PG, axis=1) == jnp.min(rewards_PG, axis=1)
  centered_PG = rewards_PG - jnp.mean(rewards_PG, axis=1, keepdims=True)
  return jnp.where(equal_P[:, None], 0.0, centered_PG), equal_P


def _safe_div(num: Array, den: Array) -> Array:
  """`num / den`, and 0 where `den == 0`."""
  return jnp.where(den != 0, num / jnp.where(den != 0, den, 1.0), 0.0)


def grpo_advantages(
    rewards_PG: Array, *, std_ddof: int = 0, eps: float = 1e-6, scale: str = "group"
) -> Array:
  """GRPO: `A = (R - mean_g) / (std + eps)`.

  Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, §4.1.2. `scale='group'` uses each
  group's std, `'batch'` the std of all P·G rewards (TRL's `scale_rewards="batch"`,
  the mean is still per group), `'none'` no division (= Dr. GRPO). `std_ddof` 0 is
  the population std (seed 003: R=[1,0,0,0] -> [1.732, -0.577, -0.577, -0.577]).
  """
  _check_group(rewards_PG, "grpo")
  rewards_PG = jax.lax.stop_gradient(rewards_PG.astype(jnp.float32))
  centered_PG, equal_P = _centered(rewards_PG)
  if scale == "group":
    std_P1 = jnp.std(rewards_PG, axis=1, ddof=std_ddof, keepdims=True)
  elif scale == "batch":
    std_P1 = jnp.std(rewards_PG, ddof=std_ddof) * jnp.ones((rewards_PG.shape[0], 1))
  elif scale == "none":
    return centered_PG
  else:
    raise ValueError(f"Unknown advantage scale {scale!r}; valid: {list(SCALES)}.")
  adv_PG = centered_PG / (std_P1 + eps)
  return jnp.where(equal_P[:, None], 0.0, adv_PG)


def dr_grpo_advantages(rewards_PG: Array) -> Array:
  """Dr. GRPO: `A = R - mean_g` (no std division).

  Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783.
  """
  _check_group(rewards_PG, "dr_grpo")
  return _centered(rewards_PG)[0]


def rloo_advantages(rewards_PG: Array) -> Array:
  """RLOO: `A_i = R_i - mean_{j≠i} R_j = G/(G-1)·(R_i - mean_g)`.

  Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!";
  Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740.
  """
  _check_group(rewards_PG, "rloo")
  G = rewards_PG.shape[1]
  return _centered(rewards_PG)[0] * (G / (G - 1))


def max_rl_advantages(rewards_PG: Array) -> Array:
  """MaxRL: `A = (R - mean_g) / mean_g`; a group whose mean is 0 gets 0.

  Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning", arXiv:2602.02710
  (for 0/1 rewards this weights a prompt by 1/pass-rate).
  """
  _check_group(rewards_PG, "max_rl")
  centered_PG, _ = _centered(rewards_PG)
  mean_P1 = jnp.mean(jax.lax.stop_gradient(rewards_PG.astype(jnp.float32)), 1, keepdims=True)
  return _safe_div(centered_PG, mean_P1 * jnp.ones_like(centered_PG))


def reinforce_pp_baseline_advantages(
    rewards_PG: Array, *, lengths_PG: Array | None = None, eps: float = 1e-6
) -> Array:
  """REINFORCE++-baseline: `R - mean_g`, then normalised over all valid tokens.

  Hu et al. 2025, "REINFORCE++", arXiv:2501.03262. The advantage is constant over a
  response, so the token-level mean and std equal the response-level ones weighted
  by length `L_b`; without `lengths_PG` every response weighs 1 (exact when all
  lengths are equal).
  """
  _check_group(rewards_PG, "reinforce_pp_baseline")
  centered_PG, _ = _centered(rewards_PG)
  weights_PG = jnp.ones_like(centered_PG) if lengths_PG is None else lengths_PG
  return masked_whiten(centered_PG, weights_PG.astype(jnp.float32), eps)


def constant_advantages(rewards_PG: Array) -> Array:
  """Advantage 1 for every response (SFT as a policy loss: `-logp`, token mean)."""
  return jnp.ones(rewards_PG.shape, jnp.float32)


OutcomeFn = Callable[[Array, object, "Array | None"], Array]
# name -> fn(rewards_PG, algo_cfg, lengths_PG) -> adv_PG.
OUTCOME_ESTIMATORS: dict[str, OutcomeFn] = {
    "grpo": lambda r, cfg, _: grpo_advantages(
        r, std_ddof=cfg.advantage.std_ddof, eps=cfg.advantage.eps,
        scale=cfg.advantage.scale),
    "dr_grpo": lambda r, cfg, _: dr_grpo_advantages(r),
    "rloo": lambda r, cfg, _: rloo_advantages(r),
    "max_rl": lambda r, cfg, _: max_rl_advantages(r),
    "reinforce_pp_baseline": lambda r, cfg, lengths: reinforce_pp_baseline_advantages(
        r, lengths_PG=lengths, eps=cfg.advantage.eps),
    "constant": lambda r, cfg, _: constant_advantages(r),
}
ESTIMATORS = tuple(OUTCOME_ESTIMATORS) + TOKEN_ESTIMATORS + STATEFUL_ESTIMATORS


def rae_baselines(rewards_B: Array, keys_B: Array, baselines_K: Array,
                  decay: float) -> tuple[Array, Array]:
  """SPIRAL's role-conditioned baselines (RAE), one exponential moving average per key.

  Liu et al. 2025, "SPIRAL", arXiv:2506.24119; as prime-rl's `RAEAlgorithm`
  (`src/prime_rl/orchestrator/algo/rae.py`, commit 559b447): rows are scored in order,
  each against its key's baseline BEFORE its own reward updates it,
  `b_k <- decay·b_k + (1 - decay)·r`. The advantage is then `r - seen` (not normalised,
  any group size). A single key is REINFORCE with an EMA baseline.

  Args:
    rewards_B: `[B]` rewards, in row order.
    keys_B: `[B]` int32 index of each row's baseline (its source, later its agent).
    baselines_K: `[K]` float32 baselines before this batch (zeros at the start of a run).
    decay: the EMA's decay (0.95 in SPIRAL and prime-rl), or `[K]`, one per key.

  Returns:
    `(seen_B, baselines_K)`: the baseline each row was scored against, and the baselines
    after the batch (to carry to the next step).
  """
  if not isinstance(decay, jax.Array):  # host numbers: 1 - decay rounds once, to float32
    decay = np.asarray(decay, np.float64)
  keep_K, gain_K = (jnp.broadcast_to(jnp.asarray(x, jnp.float32), baselines_K.shape)
                    for x in (decay, 1.0 - decay))

  def score(baselines, row):
    reward, key = row
    seen = baselines[key]
    return baselines.at[key].set(keep_K[key] * seen + gain_K[key] * reward), seen

  rewards_B = jax.lax.stop_gradient(rewards_B.astype(jnp.float32))
  baselines_K, seen_B = jax.lax.scan(score, baselines_K.astype(jnp.float32),
                                     (rewards_B, keys_B.astype(jnp.int32)))
  return seen_B, baselines_K


def outcome_advantages(rewards_PG: Array, cfg, *, lengths_PG: Array | None = None) -> Array:
  """Response-level advantages `[P, G] -> [P, G]` chosen by `cfg.advantage.estimator`.

  If `cfg.advantage.fn` is set (`"pkg.module:fn"` or `"path/file.py:fn"`), that
  function is called as `fn(rewards_PG, cfg)` instead of the built-in.

  Args:
    rewards_PG: one scalar reward per response.
    cfg: `config.algo`.
    lengths_PG: response lengths `L_b`; only `reinforce_pp_baseline` uses them (to
      weight its batch normalisation by tokens).

  Returns:
    `[P, G]` float32 advantages, stop-gradient.
  """
  if cfg.advantage.fn:
    adv_PG = import_path.load_function(cfg.advantage.fn)(rewards_PG, cfg)
    return jax.lax.stop_gradient(jnp.asarray(adv_PG, jnp.float32))
  name = cfg.advantage.estimator
  if name in TOKEN_ESTIMATORS:
    raise ValueError(
        f"Estimator {name!r} gives token-level advantages; call token_advantages().")
  if name not in OUTCOME_ESTIMATORS:
    raise ValueError(f"Unknown advantage estimator {name!r}; valid: {list(ESTIMATORS)}.")
  return OUTCOME_ESTIMATORS[name](rewards_PG, cfg, lengths_PG)


def zero_variance_group_frac(rewards_PG: Array) -> Array:
  """Fraction of groups whose rewards are all equal (they carry no signal)."""
  return jnp.mean((jnp.max(rewards_PG, 1) == jnp.min(rewards_PG, 1)).astype(jnp.float32))


# ---------------------------------------------------------------- token-level pieces


def last_token_mask(mask_BT: Array) -> Array:
  """1 on each row's last valid token, 0 elsewhere (all 0 for an empty row)."""
  mask_BT = mask_BT.astype(jnp.float32)
  valid_at_or_after_BT = jnp.flip(jnp.cumsum(jnp.flip(mask_BT, 1), axis=1), 1)
  return mask_BT * (valid_at_or_after_BT == 1.0)


def outcome_token_rewards(
    rewards_B: Array, mask_BT: Array, *, kl_BT: Array | None = None, kl_coef: float = 0.0
) -> Array:
  """Token rewards `r_t = R·[t is the last valid token] - β·kl_t` (PPO-RLHF, REINFORCE++).

  Args:
    rewards_B: outcome reward per response.
    mask_BT: valid completion tokens.
    kl_BT: optional per-token KL estimate (k1 = `old_logp - ref_logp` in the presets).
    kl_coef: β.

  Returns:
    `[B, T]` float32, 0 on masked tokens, stop-gradient.
  """
  token_rewards_BT = last_token_mask(mask_BT) * rewards_B.astype(jnp.float32)[:, None]
  if kl_BT is not None:
    token_rewards_BT -= kl_coef * kl_BT.astype(jnp.float32) * mask_BT.astype(jnp.float32)
  return jax.lax.stop_gradient(token_rewards_BT)


def kl_penalised_rewards(
    rewards_B: Array, mask_BT: Array, kl_BT: Array, kl_coef: float
) -> Array:
  """Response rewards `R - β·Σ_t kl_t` for outcome estimators with KL in the reward.

  The same KL charge as `outcome_token_rewards`, summed over the response before the
  group baseline (as TRL's and OpenRLHF's RLOO do). Stop-gradient.
  """
  kl_B = jnp.sum(kl_BT.astype(jnp.float32) * mask_BT.astype(jnp.float32), axis=1)
  return jax.lax.stop_gradient(rewards_B.astype(jnp.float32) - kl_coef * kl_B)


def _reverse_scan(step, init, xs_BT: tuple[Array, ...]) -> Array:
  """Runs `step` from t = T-1 down to 0 over `[B, T]` inputs; returns `[B, T]`."""
  xs_TB = tuple(x.astype(jnp.float32).T for x in xs_BT)
  _, out_TB = jax.lax.scan(step, init, xs_TB, reverse=True)
  return out_TB.T


def discounted_returns(token_rewards_BT: Array, mask_BT: Array, gamma: float) -> Array:
  """`G_t = Σ_{k≥t} γ^{k-t} r_k` over valid tokens only (masked tokens are skipped).

  Returns `[B, T]`, 0 on masked tokens, stop-gradient.
  """
  token_rewards_BT = jax.lax.stop_gradient(token_rewards_BT)

  def step(next_return_B, x):
    r_B, m_B = x
    ret_B = r_B + gamma * next_return_B
    return jnp.where(m_B > 0, ret_B, next_return_B), jnp.where(m_B > 0, ret_B, 0.0)

  B = mask_BT.shape[0]
  return _reverse_scan(step, jnp.zeros((B,), jnp.float32), (token_rewards_BT, mask_BT))


def gae(
    token_rewards: Array, values: Array, mask: Array, gamma: float, lam: float
) -> tuple[Array, Array]:
  """Generalised advantage estimation over the valid tokens of each response.

  `δ_t = r_t + γ·V_{t+1} - V_t`, `A_t = δ_t + γλ·A_{t+1}`, `returns = A + V`, computed
  backward (`lax.scan`, reverse) over valid tokens only: a masked token is skipped,
  and the value after the last valid token is 0 (the response ends there).
  Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE",
  arXiv:1506.02438; flax `ppo_lib.gae_advantages`.

  Args:
    token_rewards: `[B, T]` per-token rewards (`outcome_token_rewards`, minus β·KL
      when KL is in the reward).
    values: `[B, T]` value predictions `V_t` of the behaviour-time value model.
    mask: `[B, T]` 1 on valid completion tokens.
    gamma: discount γ.
    lam: GAE λ.

  Returns:
    `(advantages, returns)`, `[B, T]` float32 each, 0 on masked tokens, stop-gradient.
  """
  token_rewards = jax.lax.stop_gradient(token_rewards)
  values = jax.lax.stop_gradient(values)

  def step(carry, x):
    next_value_B, next_adv_B = carry
    r_B, v_B, m_B = x
    adv_B = r_B + gamma * next_value_B - v_B + gamma * lam * next_adv_B
    valid_B = m_B > 0
    carry = (jnp.where(valid_B, v_B, next_value_B), jnp.where(valid_B, adv_B, next_adv_B))
    return carry, jnp.where(valid_B, adv_B, 0.0)

  zeros_B = jnp.zeros((mask.shape[0],), jnp.float32)
  adv_BT = _reverse_scan(step, (zeros_B, zeros_B), (token_rewards, values, mask))
  returns_BT = (adv_BT + values.astype(jnp.float32)) * mask.astype(jnp.float32)
  return adv_BT, returns_BT


def masked_whiten(x: Array, mask: Array, eps: float) -> Array:
  """`(x - mean) / (std + eps)` over entries with `mask > 0` (weighted by `mask`).

  Population std. Masked entries come back as 0; constant inputs give 0, not NaN.
  """
  x = jax.lax.stop_gradient(x.astype(jnp.float32))
  mask = mask.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(mask), 1e-12)
  mean = jnp.sum(x * mask) / count
  std = jnp.sqrt(jnp.sum(jnp.square(x - mean) * mask) / count)
  white = _safe_div(x - mean, (std + eps) * jnp.ones_like(x))
  return jnp.where(mask > 0, white, 0.0)


# ---------------------------------------------------------------- the trainer's entry


def _reward_kl(mask_BT: Array, cfg, logp_BT: Array | None, ref_logp_BT: Array | None
               ) -> tuple[Array, float]:
  """(per-token kl_t, β) charged as a reward (`cfg.kl.placement == 'reward'`), else (0, 0)."""
  if not (cfg.kl.placement == "reward" and cfg.kl.coef > 0):
    return jnp.zeros_like(mask_BT), 0.0
  if logp_BT is None or ref_logp_BT is None:
    raise ValueError("KL in the reward needs logp_BT and ref_logp_BT.")
  valid_BT = mask_BT > 0  # padding log-probs may be anything
  kl_BT = kl_lib.kl_divergence(jnp.where(valid_BT, logp_BT, 0.0),
                               jnp.where(valid_BT, ref_logp_BT, 0.0), cfg.kl.estimator)
  return kl_BT, cfg.kl.coef


def token_advantages(
    rewards_PG: Array,
    mask_BT: Array,
    cfg,
    *,
    logp_BT: Array | None = None,
    ref_logp_BT: Array | None = None,
    values_BT: Array | None = None,
    baselines_B: Array | None = None,
    turn_rewards_BT: Array | None = None,
) -> tuple[Array, Array | None]:
  """Per-token advantages for any `cfg.advantage.estimator`, KL-in-reward included.

  With `cfg.kl.placement == 'reward'` and `cfg.kl.coef = β > 0`, the per-token
  `kl_t = kl_divergence(logp, ref_logp, cfg.kl.estimator)` (k1 in the presets) is
  charged as a reward:
    * `reinforce_pp`, `gae`: token rewards `r_t = R·[t = last] - β·kl_t`
      (Ouyang et al. 2022 InstructGPT; Hu 2025 REINFORCE++).
    * outcome estimators (`rloo`, `grpo`, ...): the response reward becomes
      `R - β·Σ_t kl_t` before the group baseline, as TRL's and OpenRLHF's RLOO do.
  `reinforce_pp`: `G_t = Σ_{k≥t} γ^{k-t} r_k`, then `masked_whiten` over all valid
  tokens of the batch. `gae`: `gae(...)`, then whitening if `cfg.advantage.whiten`.

  Args:
    rewards_PG: outcome rewards, `[P, G]`.
    mask_BT: `[B, T]`, B = P·G, group-major.
    cfg: `config.algo`.
    logp_BT: behaviour-policy log-probs (needed for KL in the reward).
    ref_logp_BT: reference log-probs (needed for KL in the reward).
    values_BT: value predictions (needed for `gae`).
    baselines_B: the baseline each row is scored against (`rae`: `rae_baselines`).
    turn_rewards_BT: a multi-turn episode's step rewards, each on its turn's last token
      (their sum is part of the row's outcome reward). The token-level estimators then
      reward `turn_rewards_BT` where they sit and the rest of the outcome, `R - Σ_t
      turn_rewards`, on the last valid token, so GAE assigns credit within an episode;
      the outcome estimators read only `R`.

  Returns:
    `(adv_BT, returns_BT)`: float32, 0 on masked tokens, stop-gradient; `returns_BT`
    is the value target for `gae` and `None` otherwise.
  """
  P, G = rewards_PG.shape
  mask_BT = mask_BT.astype(jnp.float32)
  rewards_B = jax.lax.stop_gradient(rewards_PG.astype(jnp.float32)).reshape(P * G)
  kl_BT, kl_coef = _reward_kl(mask_BT, cfg, logp_BT, ref_logp_BT)
  name = cfg.advantage.estimator
  if name in STATEFUL_ESTIMATORS and not cfg.advantage.fn:
    if baselines_B is None:
      raise ValueError(f"The {name} estimator needs baselines_B (rae_baselines).")
    adv_B = kl_penalised_rewards(rewards_B, mask_BT, kl_BT, kl_coef) - baselines_B
    return adv_B[:, None] * mask_BT, None
  if cfg.advantage.fn or name not in TOKEN_ESTIMATORS:
    penalised_PG = kl_penalised_rewards(rewards_B, mask_BT, kl_BT, kl_coef).reshape(P, G)
    lengths_PG = jnp.sum(mask_BT, axis=1).reshape(P, G)
    adv_PG = outcome_advantages(penalised_PG, cfg, lengths_PG=lengths_PG)
    return adv_PG.reshape(P * G)[:, None] * mask_BT, None

  if turn_rewards_BT is None:
    token_rewards_BT = outcome_token_rewards(rewards_B, mask_BT, kl_BT=kl_BT, kl_coef=kl_coef)
  else:
    turn_BT = jax.lax.stop_gradient(turn_rewards_BT.astype(jnp.float32)) * mask_BT
    token_rewards_BT = outcome_token_rewards(rewards_B - jnp.sum(turn_BT, axis=1), mask_BT,
                                             kl_BT=kl_BT, kl_coef=kl_coef) + turn_BT
  if name == "reinforce_pp":
    returns_BT = discounted_returns(token_rewards_BT, mask_BT, cfg.advantage.gamma)
    return masked_whiten(returns_BT, mask_BT, cfg.advantage.eps), None
  if values_BT is None:
    raise ValueError("The gae estimator needs values_BT from the value model.")
  adv_BT, returns_BT = gae(
      token_rewards_BT, values_BT, mask_BT, cfg.advantage.gamma, cfg.advantage.lam)
  if cfg.advantage.whiten:
    adv_BT = masked_whiten(adv_BT, mask_BT, cfg.advantage.eps)
  return adv_BT, returns_BT
