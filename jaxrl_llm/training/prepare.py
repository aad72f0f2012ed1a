"""A rollout becomes a training batch: rows on the mesh, then old and reference
log-probs, values and advantages in one compiled program (`prepare_batch`).

A training batch is a dict of arrays whose first axis is its B rows (see `steps`);
which keys it has is the plan's decision (`plan.Plan`), made once.
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import distributed, objectives
from jaxrl_llm import sharding as sh
from jaxrl_llm.training import steps
from jaxrl_llm.training.plan import Plan
from jaxrl_llm.training.rollouts import Rollout, prompt_aligned_routing


def batch_arrays(r: Rollout, G: int, mask_truncated: bool) -> dict[str, np.ndarray]:
  """The rollout as training rows: prompt + completion, masks, sampler log-probs.

  Prompts are left-padded to the longest prompt block of any process, so that every
  process's rows have the global batch's shape.
  """
  extra = distributed.max_int(r.prompt_tokens.shape[1]) - r.prompt_tokens.shape[1]
  prompt_tokens = np.repeat(np.pad(r.prompt_tokens, ((0, 0), (extra, 0))), G, axis=0)
  prompt_mask = np.repeat(np.pad(r.prompt_mask, ((0, 0), (extra, 0))), G, axis=0)
  loss_mask = r.mask * np.repeat(r.group_valid, G)[:, None]
  if mask_truncated:
    loss_mask = loss_mask * (~r.truncated)[:, None]
  episodes = r.episodes
  out = {
      "tokens": np.concatenate([prompt_tokens, r.tokens], axis=1).astype(np.int32),
      "attention_mask": np.concatenate([prompt_mask, r.attention], axis=1).astype(np.int32),
      "loss_mask": loss_mask.astype(np.int32),
      "rewards": r.rewards.astype(np.float32),  # [B]: every batch array's first axis is its rows
  }
  if episodes is not None and episodes.echo_weights is not None:  # echo: the environment's
    out["echo_weights"] = (episodes.echo_weights  # tokens of the weighted roles
                           * np.repeat(r.group_valid, G)[:, None]).astype(np.float32)
  if episodes is not None and episodes.turn_rewards is not None:  # each step's reward on
    out["turn_rewards"] = episodes.turn_rewards.astype(np.float32)  # its turn's last token
  if r.logprobs is not None:
    out["sampler_logp"] = r.logprobs.astype(np.float32)
  if r.routing is not None:  # an MoE policy's experts, for replay and routing_mismatch
    out["routing"] = prompt_aligned_routing(
        r.routing, extra + r.prompt_tokens.shape[1], r.tokens.shape[1]).astype(np.int32)
  if r.mixed is not None:  # each row's source (its per-row algorithm)
    out["source"] = np.repeat(r.mixed.sources, G).astype(np.int32)
  if r.hinted is not None:  # self-distillation: the same completions after a hint
    extra = distributed.max_int(r.hinted.tokens.shape[1]) - r.hinted.tokens.shape[1]
    hinted = lambda a: np.repeat(np.pad(a, ((0, 0), (extra, 0))), G, axis=0)
    out["hint_tokens"] = np.concatenate([hinted(r.hinted.tokens), r.tokens], 1).astype(np.int32)
    out["hint_attention_mask"] = np.concatenate([hinted(r.hinted.mask), r.mask],
                                                1).astype(np.int32)
  return out


def place_batch(arrays: dict[str, np.ndarray], mesh, rules) -> dict[str, jax.Array]:
  """Each process's rows -> global arrays sharded over the batch axis."""
  return {k: sh.put_process_rows(v, (sh.BATCH,) + (None,) * (v.ndim - 1), mesh, rules)
          for k, v in arrays.items()}


def prepare_batch(batch, policy, reference, value, teacher=None, baselines=None, *,
                  plan: Plan, num_samples: int, temperature: float, chunk_size: int,
                  num_micro: int):
  """Old/reference/teacher log-probs, values and advantages of a rollout batch (jitted whole).

  The forwards run on the update's micro-batch shapes (`steps.map_micro`, `num_micro`
  pieces), so recomputed old log-probs equal the update's first forward bit for bit.
  `baselines`: a stateful estimator's (`TrainState.baselines`, `rae`), else None.
  Returns (the training batch, metrics: `behaviour_mask_frac` when a behaviour mask
  applies, `distill/reverse_kl` with a teacher, `rae_baseline`; the baselines after this
  batch, or None).
  """
  algo, out, mask = plan.algo, dict(batch), batch["loss_mask"]
  logp = lambda model, replay=False: steps.map_micro(
      lambda piece: steps.completion_logp(model, piece, temperature=temperature,
                                          chunk_size=chunk_size, replay=replay)[0],
      batch, num_micro)
  old_logp = ref_logp = values = teacher_logp = None
  if plan.old_logp == "sampler":
    old_logp = jnp.where(mask > 0, batch["sampler_logp"], 0.0)
  elif plan.old_logp == "recompute":  # as the update will route (routing replay)
    old_logp = jnp.where(mask > 0, logp(policy, steps.replays_routing(policy.config, algo)), 0.0)
  if reference is not None:
    ref_logp = jnp.where(mask > 0, logp(reference), 0.0)
  if teacher is not None:
    teacher_logp = jnp.where(mask > 0, logp(teacher), 0.0)
  if "hint_tokens" in batch:  # opsd: the policy as its own teacher, reading a hint first
    hinted = {"tokens": batch["hint_tokens"], "attention_mask": batch["hint_attention_mask"],
              "loss_mask": mask}
    self_logp = jnp.where(mask > 0, steps.map_micro(
        lambda piece: steps.completion_logp(policy, piece, temperature=temperature,
                                            chunk_size=chunk_size)[0], hinted, num_micro), 0.0)
    own = _per_row(plan, batch, lambda a: a.distill.teacher == "self")
    teacher_logp = (self_logp if teacher_logp is None and not plan.mixed else
                    jnp.where(own > 0, self_logp, 0.0 if teacher_logp is None else teacher_logp))
  if value is not None:
    values = steps.map_micro(lambda piece: steps.completion_values(value, piece), batch,
                             num_micro)
  metrics = {}
  adv, returns, baselines = _advantages(batch, mask, plan, num_samples, old_logp, ref_logp,
                                        values, baselines, metrics)
  if teacher_logp is not None:
    metrics["distill/reverse_kl"] = objectives.reverse_kl(old_logp, teacher_logp, mask)
    shaping = _per_row(plan, batch, lambda a: a.distill.shaping_coef)
    if shaping is not None:
      adv = objectives.distill_shaped_advantages(adv, old_logp, teacher_logp, mask, shaping)
  if plan.corrects_behaviour and algo.tis_cap > 0:
    adv = adv * objectives.truncated_importance_weight(old_logp, batch["sampler_logp"],
                                                       algo.tis_cap)
  if plan.corrects_behaviour and algo.behaviour_mask.level != "off":
    # After the advantages: the group baselines see every reward.
    out["loss_mask"], metrics["behaviour_mask_frac"] = objectives.behaviour_mask(
        old_logp, batch["sampler_logp"], mask, algo.behaviour_mask)
  out["advantages"] = adv
  if old_logp is not None:
    out["old_logp"] = old_logp
  if ref_logp is not None and algo.kl.placement == "loss":
    out["ref_logp"] = ref_logp
  if teacher_logp is not None and _per_row(plan, batch, lambda a: a.distill.coef) is not None:
    out["teacher_logp"] = teacher_logp
  if plan.mixed:  # each row's coefficients of the loss's terms (objectives.policy_loss)
    out["pg_weight"] = _per_row(plan, batch, lambda a: a.loss.pg_coef, always=True)[:, 0]
    distill = _per_row(plan, batch, lambda a: a.distill.coef)
    if distill is not None:
      out["distill_weight"] = distill[:, 0]
    out.pop("source")
  if values is not None:
    out.update(old_values=values, returns=returns)
    if plan.mixed:  # the critic learns the returns of the rows whose source uses them (gae)
      own = _per_row(plan, batch, lambda a: a.advantage.estimator == "gae" and not a.advantage.fn,
                     always=True)
      out["value_mask"] = (out["loss_mask"] * own).astype(out["loss_mask"].dtype)
  out.pop("rewards")
  for key in ("sampler_logp", "hint_tokens", "hint_attention_mask", "turn_rewards"):
    out.pop(key, None)
  return out, metrics, baselines


def _per_row(plan: Plan, batch, coef, always: bool = False):
  """A per-row algorithm coefficient `coef(algo)`: the scalar of a one-source run, or each
  row's source's as float32 [B, 1] in a mixed one; None when it is 0 everywhere (unless
  `always`)."""
  values = [float(coef(s.algo)) for s in plan.sources]
  if not always and not any(values):
    return None
  if not plan.mixed:
    return values[0]
  return jnp.asarray(values, jnp.float32)[batch["source"]][:, None]


def _advantages(batch, mask, plan: Plan, num_samples: int, old_logp, ref_logp, values,
                baselines, metrics):
  """(advantages [B, N], value targets or None, baselines after the batch or None).

  Each distinct advantage setting among the sources is computed over the whole batch with
  the mask cut to its own sources' rows (a group belongs to one source, and the
  whitening of `reinforce_pp` and `gae` sees only those rows), and every row keeps its
  own source's: a row gets exactly what a run of its source alone would give it.
  """
  rewards_PG = batch["rewards"].reshape(-1, num_samples)
  source_B = batch["source"] if plan.mixed else jnp.zeros(rewards_PG.size, jnp.int32)
  seen_B = None
  if baselines is not None:  # rae: one baseline per source
    decay_K = np.asarray([s.algo.advantage.decay for s in plan.sources], np.float64)
    seen_B, baselines = objectives.rae_baselines(batch["rewards"], source_B, baselines,
                                                 decay_K if plan.mixed else decay_K[0])
    metrics["rae_baseline"] = jnp.mean(baselines)
  settings: dict[str, list[int]] = {}
  for i, source in enumerate(plan.sources):
    settings.setdefault(json.dumps(source.algo.advantage.to_dict(), sort_keys=True), []).append(i)
  adv = returns = None
  for members in settings.values():
    algo = plan.sources[members[0]].algo
    rows_mask = mask
    if plan.mixed:
      rows_mask = mask * jnp.isin(source_B, jnp.asarray(members))[:, None].astype(mask.dtype)
    adv_i, returns_i = objectives.token_advantages(
        rewards_PG, rows_mask, algo, logp_BT=old_logp, ref_logp_BT=ref_logp, values_BT=values,
        baselines_B=seen_B, turn_rewards_BT=batch.get("turn_rewards"))
    adv = adv_i if adv is None else adv + adv_i  # disjoint rows: 0 outside each's own
    if returns_i is not None:
      returns = returns_i if returns is None else returns + returns_i
  return adv, returns, baselines
