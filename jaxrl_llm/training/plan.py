"""The plan of a run: what its algorithm needs, worked out once from the config.

Which models exist, where the old log-probs come from and how rollouts arrive follow
from `config.algo`'s axes; `make_plan` decides each once, every phase of the trainer
reads the plan, and the trainer prints it at start. Nothing here (or anywhere in the
trainer) looks at an algorithm's name.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_llm import objectives
from jaxrl_llm.config import sources as sources_lib

OLD_LOGP_SOURCES = ("sampler", "recompute", "own")


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a run does, resolved from its config.

  Attributes:
    algo: `config.algo` with its field references resolved (what the steps read).
    reference: a frozen copy of the initial policy scores the batch (a KL term).
    value_model: a critic is trained beside the policy (`algo.value.coef > 0`).
    teacher: a frozen teacher (`config.teacher.path`) scores the batch (distillation).
    self_teacher: the policy scores each completion after a hint block (opsd,
      `algo.distill.teacher = 'self'`, for some source).
    baselines: how many baselines a stateful estimator (`rae`) carries in the train state,
      one per source (0: none).
    sources: the run's sources (`config.sources`, or the one `config.data` names), each
      with its per-row algorithm (`jaxrl_llm.config.sources`).
    mixed: rows carry their source's index and per-row weights (`config.sources` is set).
    completions: 'sample' (the policy samples G per prompt) or 'dataset' (each record's
      target, SFT).
    old_logp: where the update's old log-probs come from: 'sampler' (the behaviour
      log-probs recorded while sampling), 'recompute' (the trainer's forward before the
      update, on the update's micro-batch shapes) or 'own' (nothing reads them: the
      update takes its own log-probs, stop-gradient).
    corrects_behaviour: recomputed old log-probs are compared with the recorded ones
      (`algo.tis_cap`, `algo.behaviour_mask`).
    max_async_level: rollouts sampled up to this many updates ahead (0: synchronous).
    partial: generations span publishes, a step's batch the first groups to finish
      (`config.rollouts.partial`; `rollouts.partial`).
    rollout_devices: devices of the sampler's own mesh (0: it shares the trainer's).
    updates_per_step: optimizer updates per step (passes x minibatches).
    rows_per_prompt: training rows of each prompt: G, times an agent episode's samples
      (`sources.rows_per_prompt`).
  """
  algo: Any
  reference: bool
  value_model: bool
  teacher: bool
  self_teacher: bool
  baselines: int
  sources: tuple
  mixed: bool
  completions: str
  old_logp: str
  corrects_behaviour: bool
  max_async_level: int
  rollout_devices: int
  updates_per_step: int
  rows_per_prompt: int = 1
  partial: bool = False

  @property
  def samples_per_episode(self) -> int:
    """Rows of each episode (or completion): `agent_samples`, else 1."""
    return max(int(s.env.get("agent_samples", 1)) for s in self.sources)

  def describe(self) -> str:
    """One line per decision, for the start of a run's log."""
    models = (["policy"] + ["reference"] * self.reference + ["value model"] * self.value_model
              + ["teacher"] * self.teacher + ["the policy after a hint, as teacher"]
              * self.self_teacher)
    rollouts = ("sampled by the policy" if self.completions == "sample"
                else "the dataset's completions")
    if self.max_async_level:
      rollouts += f", up to {self.max_async_level} updates ahead"
    if self.partial:
      rollouts += ", generations spanning publishes (the first groups to finish)"
    if self.rollout_devices:
      rollouts += f", on {self.rollout_devices} devices of their own"
    return "\n".join([
        f"plan: models: {', '.join(models)}",
        f"plan: rollouts: {rollouts}",
        *([f"plan: sources: " + ", ".join(
            f"{s.name} ({s.weight:g}: " + ", ".join(
                ([f"{s.algo.advantage.fn or s.algo.advantage.estimator}"
                  + (f" x {s.algo.loss.pg_coef:g}" if s.algo.loss.pg_coef != 1 else "")]
                 if s.algo.loss.pg_coef else [])
                + ([f"distill {s.algo.distill.coef:g}"
                    + (" (self, hinted)" if s.algo.distill.teacher == "self" else "")]
                   if s.algo.distill.coef else [])
                + ([f"shaping {s.algo.distill.shaping_coef:g}"]
                   if s.algo.distill.shaping_coef else [])) + ")"
            for s in self.sources)] if self.mixed else []),
        f"plan: old log-probs: {self.old_logp}"
        + (" (compared with the sampler's)" if self.corrects_behaviour else ""),
        f"plan: {self.updates_per_step} optimizer update(s) per step"])


def resolve_old_logp(config) -> str:
  """'sampler' or 'recompute': `config.algo.old_logp`, with 'auto' decided.

  'auto' recomputes them with the trainer's forward when the model computes below
  float32 and the loss has an importance ratio, as verl does: the sampler's decode
  (a KV cache, another op order) rounds bf16 differently from the update's forward,
  so the ratio would start away from 1 and a tight clip (GSPO's) would clip on-policy
  data; the recomputed ones are the update's first forward bit for bit
  (`models.COMPILER_OPTIONS`). In float32 both agree to ~1e-5 and the sampler's save a
  forward. A behaviour mask also recomputes: it compares the policy at the start of
  the update with the recorded behaviour log-probs. Asynchronous rollouts alone do not:
  the ratio then centres on the (up to k updates older) behaviour policy; set
  'recompute' to centre it on the current one.
  """
  chosen = config.algo.old_logp
  if chosen != "auto":
    return chosen
  low_precision = config.model.dtype != "float32"
  masked = config.algo.behaviour_mask.level != "off"
  return ("recompute" if (low_precision or masked) and config.algo.loss.ratio != "none"
          else "sampler")


def make_plan(config) -> Plan:
  """The plan of a (validated) config."""
  algo = config.algo
  resolved = resolve_old_logp(config)
  sources = sources_lib.run_sources(config)
  stateful = any(not s.algo.advantage.fn
                 and s.algo.advantage.estimator in objectives.STATEFUL_ESTIMATORS for s in sources)
  sampled = config.data.completions == "sample"
  # Without sampled log-probs (SFT) only an importance ratio, the KL-in-reward term or an
  # explicit 'recompute' read old log-probs; otherwise the update's own (stop-gradient)
  # equal what a recomputation gives and save a forward pass per step.
  needed = (algo.loss.ratio != "none" or resolved == "recompute"
            or (algo.kl.coef > 0 and algo.kl.placement == "reward"))
  old_logp = resolved if sampled else ("recompute" if needed else "own")
  return Plan(
      algo=algo.copy_and_resolve_references(),
      reference=algo.kl.coef > 0 and algo.kl.placement != "none",
      value_model=algo.value.coef > 0,
      teacher=bool(config.teacher.path),
      self_teacher=any(s.algo.distill.teacher == "self"
                       and (s.algo.distill.coef or s.algo.distill.shaping_coef) for s in sources),
      baselines=len(sources) if stateful else 0,
      sources=sources,
      mixed=sources_lib.is_mixed(config),
      completions=config.data.completions,
      old_logp=old_logp,
      corrects_behaviour=sampled and old_logp == "recompute",
      max_async_level=int(algo.max_async_level),
      rollout_devices=int(config.mesh.rollout_devices),
      updates_per_step=algo.num_iterations * algo.num_minibatches,
      rows_per_prompt=sources_lib.rows_per_prompt(config),
      partial=bool(config.rollouts.partial))
