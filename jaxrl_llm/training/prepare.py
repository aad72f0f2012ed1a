"""A rollout becomes a training batch: rows on the mesh, then old and reference
log-probs, values and advantages in one compiled program (`prepare_batch`).

A training batch is a dict of arrays whose first axis is its B rows (see `steps`);
which keys it has is the plan's decision (`plan.Plan`), made once.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import distributed, objectives
from jaxrl_llm import sharding as sh
from jaxrl_llm.training import steps
from jaxrl_llm.training.plan import Plan
from jaxrl_llm.training.rollout import Rollout


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
  out = {
      "tokens": np.concatenate([prompt_tokens, r.tokens], axis=1).astype(np.int32),
      "attention_mask": np.concatenate([prompt_mask, r.mask], axis=1).astype(np.int32),
      "loss_mask": loss_mask.astype(np.int32),
      "rewards": r.rewards.astype(np.float32),  # [B]: every batch array's first axis is its rows
  }
  if r.logprobs is not None:
    out["sampler_logp"] = r.logprobs.astype(np.float32)
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
  logp = lambda model: steps.map_micro(
      lambda piece: steps.completion_logp(model, piece, temperature=temperature,
                                          chunk_size=chunk_size)[0], batch, num_micro)
  old_logp = ref_logp = values = teacher_logp = None
  if plan.old_logp == "sampler":
    old_logp = jnp.where(mask > 0, batch["sampler_logp"], 0.0)
  elif plan.old_logp == "recompute":
    old_logp = jnp.where(mask > 0, logp(policy), 0.0)
  if reference is not None:
    ref_logp = jnp.where(mask > 0, logp(reference), 0.0)
  if teacher is not None:
    teacher_logp = jnp.where(mask > 0, logp(teacher), 0.0)
  if value is not None:
    values = steps.map_micro(lambda piece: steps.completion_values(value, piece), batch,
                             num_micro)
  rewards_PG = batch["rewards"].reshape(-1, num_samples)
  metrics, seen_B = {}, None
  if baselines is not None:  # one key until rows carry their source (or agent)
    rewards_B = batch["rewards"]
    seen_B, baselines = objectives.rae_baselines(
        rewards_B, jnp.zeros(rewards_B.shape, jnp.int32), baselines, algo.advantage.decay)
    metrics["rae_baseline"] = jnp.mean(baselines)
  adv, returns = objectives.token_advantages(rewards_PG, mask, algo, logp_BT=old_logp,
                                             ref_logp_BT=ref_logp, values_BT=values,
                                             baselines_B=seen_B)
  if teacher_logp is not None:
    metrics["distill/reverse_kl"] = objectives.reverse_kl(old_logp, teacher_logp, mask)
    if algo.distill.shaping_coef:
      adv = objectives.distill_shaped_advantages(adv, old_logp, teacher_logp, mask,
                                                 algo.distill.shaping_coef)
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
  if teacher_logp is not None and algo.distill.coef:
    out["teacher_logp"] = teacher_logp
  if values is not None:
    out.update(old_values=values, returns=returns)
  out.pop("rewards")
  out.pop("sampler_logp", None)
  return out, metrics, baselines
