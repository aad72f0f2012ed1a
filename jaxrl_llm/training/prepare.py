"""A rollout becomes a training batch: rows on the mesh, then old and reference
log-probs, values and advantages in one compiled program (`prepare_batch`).

A training batch is a `rollouts.TrainBatch` whose arrays' first axis is its B rows; which
of its optional fields are set is the plan's decision (`plan.Plan`), made once.
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
from jaxrl_llm.training.rollouts import Rollout, TrainBatch, prompt_aligned_routing


def batch_arrays(r: Rollout, G: int, mask_truncated: bool) -> TrainBatch:
  """The rollout as training rows on the host: prompt + completion, masks, and the parts
  the rollout has (sampler log-probs, episodes' echo weights and turn rewards, routing,
  sources, hinted prompts).

  Prompts are left-padded to the longest prompt block of any process, so that every
  process's rows have the global batch's shape.
  """
  extra = distributed.max_int(r.prompt_tokens.shape[1]) - r.prompt_tokens.shape[1]
  prompt_tokens = np.repeat(np.pad(r.prompt_tokens, ((0, 0), (extra, 0))), G, axis=0)
  prompt_mask = np.repeat(np.pad(r.prompt_mask, ((0, 0), (extra, 0))), G, axis=0)
  valid = np.repeat(r.group_valid, G)[:, None]
  loss_mask = r.mask * valid
  if mask_truncated:
    loss_mask = loss_mask * (~r.truncated)[:, None]
  episodes = r.episodes
  as_int = lambda a: None if a is None else a.astype(np.int32)
  as_float = lambda a: None if a is None else a.astype(np.float32)
  hint_tokens = hint_mask = None
  if r.hinted is not None:  # self-distillation: the same completions after a hint
    pad = distributed.max_int(r.hinted.tokens.shape[1]) - r.hinted.tokens.shape[1]
    hinted = lambda a: np.repeat(np.pad(a, ((0, 0), (pad, 0))), G, axis=0)
    hint_tokens = np.concatenate([hinted(r.hinted.tokens), r.tokens], 1)
    hint_mask = np.concatenate([hinted(r.hinted.mask), r.mask], 1)
  return TrainBatch(
      tokens=as_int(np.concatenate([prompt_tokens, r.tokens], axis=1)),
      attention_mask=as_int(np.concatenate([prompt_mask, r.attention], axis=1)),
      loss_mask=as_int(loss_mask), rewards=as_float(r.rewards),
      sampler_logp=as_float(r.logprobs),
      echo_weights=(None if episodes is None or episodes.echo_weights is None
                    else as_float(episodes.echo_weights * valid)),
      turn_rewards=None if episodes is None else as_float(episodes.turn_rewards),
      routing=None if r.routing is None else as_int(prompt_aligned_routing(
          r.routing, extra + r.prompt_tokens.shape[1], r.tokens.shape[1])),
      source_index=None if r.mixed is None else as_int(np.repeat(r.mixed.sources, G)),
      hint_tokens=as_int(hint_tokens), hint_attention_mask=as_int(hint_mask))


def place_batch(arrays: TrainBatch, mesh, rules) -> TrainBatch:
  """Each process's rows -> global arrays sharded over the batch axis."""
  return jax.tree.map(lambda v: sh.put_process_rows(v, (sh.BATCH,) + (None,) * (v.ndim - 1),
                                                    mesh, rules), arrays)


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
  algo, mask = plan.algo, batch.loss_mask
  logp = lambda model, replay=False: steps.map_micro(
      lambda piece: steps.completion_logp(model, piece, temperature=temperature,
                                          chunk_size=chunk_size, replay=replay)[0],
      batch, num_micro)
  old_logp = ref_logp = values = teacher_logp = None
  if plan.old_logp == "sampler":
    old_logp = jnp.where(mask > 0, batch.sampler_logp, 0.0)
  elif plan.old_logp == "recompute":  # as the update will route (routing replay)
    old_logp = jnp.where(mask > 0, logp(policy, steps.replays_routing(policy.config, algo)), 0.0)
  if reference is not None:
    ref_logp = jnp.where(mask > 0, logp(reference), 0.0)
  if teacher is not None:
    teacher_logp = jnp.where(mask > 0, logp(teacher), 0.0)
  if batch.hint_tokens is not None:  # opsd: the policy as its own teacher, after a hint
    hinted = TrainBatch(batch.hint_tokens, batch.hint_attention_mask, mask)
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
    adv = adv * objectives.truncated_importance_weight(old_logp, batch.sampler_logp,
                                                       algo.tis_cap)
  loss_mask = mask
  if plan.corrects_behaviour and algo.behaviour_mask.level != "off":
    # After the advantages: the group baselines see every reward.
    loss_mask, metrics["behaviour_mask_frac"] = objectives.behaviour_mask(
        old_logp, batch.sampler_logp, mask, algo.behaviour_mask)
  return _training_batch(batch, plan, loss_mask, adv, old_logp, ref_logp, teacher_logp,
                         values, returns), metrics, baselines


def _training_batch(batch: TrainBatch, plan: Plan, loss_mask, adv, old_logp, ref_logp,
                    teacher_logp, values, returns) -> TrainBatch:
  """What the update reads: the rollout's tokens, masks, echo weights and routing, and
  the arrays `prepare_batch` computed that the plan's loss uses (in a mixed run, each
  row's coefficients of the loss's terms, `objectives.policy_loss`)."""
  distill = _per_row(plan, batch, lambda a: a.distill.coef)
  value_mask = None
  if values is not None and plan.mixed:  # the critic learns the returns of its gae rows
    own = _per_row(plan, batch, lambda a: a.advantage.estimator == "gae" and not a.advantage.fn,
                   always=True)
    value_mask = (loss_mask * own).astype(loss_mask.dtype)
  return TrainBatch(
      tokens=batch.tokens, attention_mask=batch.attention_mask, loss_mask=loss_mask,
      echo_weights=batch.echo_weights, routing=batch.routing, advantages=adv,
      old_logp=old_logp, ref_logp=ref_logp if plan.algo.kl.placement == "loss" else None,
      teacher_logp=None if distill is None else teacher_logp,
      pg_weight=(_per_row(plan, batch, lambda a: a.loss.pg_coef, always=True)[:, 0]
                 if plan.mixed else None),
      distill_weight=distill[:, 0] if plan.mixed and distill is not None else None,
      old_values=values, returns=None if values is None else returns, value_mask=value_mask)


def _per_row(plan: Plan, batch, coef, always: bool = False):
  """A per-row algorithm coefficient `coef(algo)`: the scalar of a one-source run, or each
  row's source's as float32 [B, 1] in a mixed one; None when it is 0 everywhere (unless
  `always`)."""
  values = [float(coef(s.algo)) for s in plan.sources]
  if not always and not any(values):
    return None
  if not plan.mixed:
    return values[0]
  return jnp.asarray(values, jnp.float32)[batch.source_index][:, None]


def _advantages(batch, mask, plan: Plan, num_samples: int, old_logp, ref_logp, values,
                baselines, metrics):
  """(advantages [B, N], value targets or None, baselines after the batch or None).

  Each distinct advantage setting among the sources is computed over the whole batch with
  the mask cut to its own sources' rows (a group belongs to one source, and the
  whitening of `reinforce_pp` and `gae` sees only those rows), and every row keeps its
  own source's: a row gets exactly what a run of its source alone would give it.
  """
  rewards_PG = batch.rewards.reshape(-1, num_samples)
  source_B = batch.source_index if plan.mixed else jnp.zeros(rewards_PG.size, jnp.int32)
  seen_B = None
  if baselines is not None:  # rae: one baseline per source
    decay_K = np.asarray([s.algo.advantage.decay for s in plan.sources], np.float64)
    seen_B, baselines = objectives.rae_baselines(batch.rewards, source_B, baselines,
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
        baselines_B=seen_B, turn_rewards_BT=batch.turn_rewards)
    adv = adv_i if adv is None else adv + adv_i  # disjoint rows: 0 outside each's own
    if returns_i is not None:
      returns = returns_i if returns is None else returns + returns_i
  return adv, returns, baselines
