"""Checks a `config.algo` tree before training, with errors that say how to fix it.

`validate_algo` collects every problem it finds and raises one `ValueError` listing
them all; it also resolves user functions named by import path, so a typo fails at
start-up rather than at the first trace.
"""
from __future__ import annotations

from jaxrl_llm import import_path
from jaxrl_llm.objectives import advantages
from jaxrl_llm.objectives import aggregation
from jaxrl_llm.objectives import kl
from jaxrl_llm.objectives import losses
from jaxrl_llm.objectives import shaping

KL_PLACEMENTS = ("loss", "reward", "none")
OLD_LOGP_SOURCES = ("auto", "sampler", "recompute")


def _one_of(errors: list[str], field: str, value, valid) -> None:
  if value not in valid:
    errors.append(f"{field} = {value!r} is unknown; valid: {list(valid)}.")


def _resolves(errors: list[str], field: str, spec: str) -> None:
  try:
    import_path.load_function(spec)
  except Exception as e:  # noqa: BLE001 -- reported, not swallowed
    errors.append(f"{field} = {spec!r} does not resolve: {type(e).__name__}: {e}")


def _check_advantage(cfg, num_samples: int | None, errors: list[str]) -> None:
  adv = cfg.advantage
  if adv.fn:
    _resolves(errors, "algo.advantage.fn", adv.fn)
  else:
    _one_of(errors, "algo.advantage.estimator", adv.estimator, advantages.ESTIMATORS)
  _one_of(errors, "algo.advantage.scale", adv.scale, advantages.SCALES)
  if adv.std_ddof not in (0, 1):
    errors.append(f"algo.advantage.std_ddof = {adv.std_ddof!r} must be 0 or 1.")
  if adv.eps < 0:
    errors.append(f"algo.advantage.eps = {adv.eps} must be >= 0.")
  for name in ("gamma", "lam"):
    if not 0.0 <= adv[name] <= 1.0:
      errors.append(f"algo.advantage.{name} = {adv[name]} must be in [0, 1].")
  if (not adv.fn and adv.estimator in advantages.GROUP_ESTIMATORS
      and num_samples is not None and num_samples < 2):
    errors.append(f"algo.advantage.estimator = {adv.estimator!r} is a group estimator "
                  f"and needs G = sampling.num_samples >= 2, got {num_samples}.")
  if not 0.0 <= adv.decay < 1.0:
    errors.append(f"algo.advantage.decay = {adv.decay} must be in [0, 1).")
  if (not adv.fn and adv.estimator in advantages.STATEFUL_ESTIMATORS
      and cfg.kl.placement == "reward" and cfg.kl.coef > 0):
    errors.append(f"algo.advantage.estimator = {adv.estimator!r} keeps baselines of the outcome "
                  "reward: expected algo.kl.placement 'loss' or 'none', got 'reward'.")
  if not adv.fn and adv.estimator == "gae" and cfg.value.coef <= 0:
    errors.append("algo.advantage.estimator = 'gae' trains a value model: "
                  f"algo.value.coef must be > 0, got {cfg.value.coef}.")


def _check_loss(cfg, errors: list[str]) -> None:
  loss = cfg.loss
  _one_of(errors, "algo.loss.ratio", loss.ratio, losses.RATIOS)
  _one_of(errors, "algo.loss.trust_region", loss.trust_region, losses.TRUST_REGIONS)
  if loss.reducer:
    _resolves(errors, "algo.loss.reducer", loss.reducer)
  else:
    _one_of(errors, "algo.loss.aggregation", loss.aggregation, aggregation.AGGREGATIONS)
  if (not loss.reducer and loss.aggregation == "seq_mean_token_sum_norm"
      and not (loss.norm_length and loss.norm_length > 0)):
    errors.append("algo.loss.aggregation = 'seq_mean_token_sum_norm' needs "
                  f"algo.loss.norm_length > 0 (e.g. max_new_tokens), got {loss.norm_length!r}.")
  tr = loss.trust_region
  if loss.ratio == "none" and tr != "none":
    errors.append(f"algo.loss.ratio = 'none' has no ratio to clip: trust_region must be "
                  f"'none', got {tr!r}.")
  if tr == "clip" and not 0.0 < loss.clip_low < 1.0:
    errors.append(f"algo.loss.clip_low = {loss.clip_low} must be in (0, 1) for 'clip' "
                  "(the ratio is clipped at 1 - clip_low).")
  if tr in ("clip", "cispo", "gmpo") and not loss.clip_high > 0.0:
    errors.append(f"algo.loss.clip_high = {loss.clip_high} must be > 0 for {tr!r}.")
  if tr in ("cispo", "gmpo") and not loss.clip_low > 0.0:
    errors.append(f"algo.loss.clip_low = {loss.clip_low} must be > 0 for {tr!r} "
                  "(cispo: >= 1 means no lower bound; gmpo: a log-space bound).")
  if tr == "gmpo" and loss.ratio != "token":
    errors.append(f"algo.loss.trust_region = 'gmpo' clips token log-ratios: ratio must be "
                  f"'token', got {loss.ratio!r}.")
  if loss.dual_clip != 0 and not loss.dual_clip > 1.0:
    errors.append(f"algo.loss.dual_clip = {loss.dual_clip} must be 0 (off) or > 1.")
  if tr in ("dppo_tv", "ipo"):
    if loss.ratio != "token":
      errors.append(f"algo.loss.trust_region = {tr!r} compares each token's probabilities: "
                    f"ratio must be 'token', got {loss.ratio!r}.")
    for name in ("prob_low", "prob_high"):
      if not 0.0 < loss[name] <= 1.0:
        errors.append(f"algo.loss.{name} = {loss[name]} must be in (0, 1] for {tr!r} "
                      "(a change of probability).")
    if loss.log_ratio_coef < 0:
      errors.append(f"algo.loss.log_ratio_coef = {loss.log_ratio_coef} must be >= 0.")
  if tr == "sapo" and not (loss.tau_pos > 0 and loss.tau_neg > 0):
    errors.append(f"algo.loss.tau_pos / tau_neg = {loss.tau_pos} / {loss.tau_neg} must be > 0.")


def _check_rest(cfg, errors: list[str]) -> None:
  _one_of(errors, "algo.kl.estimator", cfg.kl.estimator, kl.KL_ESTIMATORS)
  _one_of(errors, "algo.kl.placement", cfg.kl.placement, KL_PLACEMENTS)
  if cfg.kl.coef < 0:
    errors.append(f"algo.kl.coef = {cfg.kl.coef} must be >= 0.")
  if cfg.value.value_clip < 0:
    errors.append(f"algo.value.value_clip = {cfg.value.value_clip} must be >= 0 (0 = off).")
  for name in ("num_iterations", "num_minibatches"):
    if cfg[name] < 1:
      errors.append(f"algo.{name} = {cfg[name]} must be >= 1.")
  _one_of(errors, "algo.old_logp", cfg.old_logp, OLD_LOGP_SOURCES)
  if cfg.tis_cap < 0:
    errors.append(f"algo.tis_cap = {cfg.tis_cap} must be >= 0 (0 = off).")
  _one_of(errors, "algo.routing_replay", cfg.get("routing_replay", "off"), ROUTING_REPLAY)
  _check_off_policy(cfg, errors)
  _check_distill(cfg, errors)
  if cfg.dynamic_sampling.enabled and cfg.dynamic_sampling.max_rounds < 1:
    errors.append(f"algo.dynamic_sampling.max_rounds = {cfg.dynamic_sampling.max_rounds} "
                  "must be >= 1.")
  ol = cfg.overlong
  if ol.enabled and not 0 <= ol.cache_len < ol.max_len:
    errors.append(f"algo.overlong: need 0 <= cache_len < max_len, got cache_len = "
                  f"{ol.cache_len}, max_len = {ol.max_len}.")


DISTILL_TEACHERS = ("model", "self")
# MoE routing replay: off, or the trainer's forwards use the experts the sampler chose.
ROUTING_REPLAY = ("off", "rollout")


def _check_distill(cfg, errors: list[str]) -> None:
  d = cfg.distill
  _one_of(errors, "algo.distill.teacher", d.teacher, DISTILL_TEACHERS)
  for name in ("coef", "shaping_coef", "log_ratio_coef"):
    if d[name] < 0:
      errors.append(f"algo.distill.{name} = {d[name]} must be >= 0.")
  if d.teacher == "self":
    if "{demonstration}" not in d.hint_template:
      errors.append(f"algo.distill.hint_template = {d.hint_template!r} must contain "
                    "'{demonstration}' (where the record's hint_field goes).")
    if not d.hint_field:
      errors.append("algo.distill.hint_field = '' must name the record field of the hint.")
    if d.max_hint_len < 1:
      errors.append(f"algo.distill.max_hint_len = {d.max_hint_len} must be >= 1.")


def _check_off_policy(cfg, errors: list[str]) -> None:
  bm = cfg.behaviour_mask
  _one_of(errors, "algo.behaviour_mask.level", bm.level, shaping.BEHAVIOUR_MASK_LEVELS)
  if bm.level != "off":
    if not 0.0 < bm.low <= 1.0 <= bm.high:
      errors.append(f"algo.behaviour_mask.low / high = {bm.low} / {bm.high}: expected "
                    "0 < low <= 1 <= high (the weight exp(o - b) is 1 on-policy).")
    if cfg.old_logp == "sampler":
      errors.append(f"algo.behaviour_mask.level = {bm.level!r} compares the trainer's old "
                    "log-probs with the sampler's: algo.old_logp must be 'recompute' or 'auto', "
                    "got 'sampler'.")
  if not isinstance(cfg.max_async_level, int) or cfg.max_async_level < 0:
    errors.append(f"algo.max_async_level = {cfg.max_async_level!r} must be an int >= 0 "
                  "(0 = synchronous).")


def validate_algo(cfg, num_samples: int | None = None) -> None:
  """Raises `ValueError` listing every problem in `config.algo`.

  Args:
    cfg: `config.algo`.
    num_samples: G, responses per prompt (`config.sampling.num_samples`); group
      estimators need G >= 2. `None` skips that check.
  """
  errors: list[str] = []
  _check_advantage(cfg, num_samples, errors)
  _check_loss(cfg, errors)
  _check_rest(cfg, errors)
  if errors:
    raise ValueError("Invalid config.algo:\n  " + "\n  ".join(errors))
