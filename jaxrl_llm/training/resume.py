"""Where a run starts: fresh, or from the workdir's latest checkpoint, if that checkpoint
belongs to this run.

Two checks before anything is loaded or written, one before anything is written (a refused
run leaves the workdir as it was):
- the state's shapes (`fingerprint`: the model's architecture and whether a critic is
  trained): a checkpoint of another shape cannot be restored at all;
- the run's algorithm and model (`run_identity`: `config.algo` and `config.model` but for
  its speed settings): another algorithm or model on a workdir with checkpoints is refused
  unless the caller resumes with changes on purpose (`allow_changes`,
  `jaxrl-llm-train --resume_with_changes`);
- with LoRA, the frozen base's values (`lora.fingerprint`, recorded as
  `base_fingerprint`): adapters trained on one base are refused on another, even one at
  the same path (checked once the base is loaded, in `start_point`).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from jaxrl_llm import checkpoints, models
from jaxrl_llm.config import schema
from jaxrl_llm.config.errors import ConfigError
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.training import setup as setup_lib
from jaxrl_llm.training import state as state_lib
from jaxrl_llm.training.plan import Plan

# config.model fields that change speed or memory, not the model or its state's shapes: a run
# resumes with other values (`fingerprint` and `run_identity` both leave them out).
SPEED_FIELDS = ("remat", "attention", "moe_impl")


@dataclasses.dataclass
class Start:
  """Where a run starts: its state, the step and data position, the skip counters."""
  state: state_lib.TrainState
  step: int = 0
  data_position: int = 0
  skipped_steps: int = 0
  consecutive_skips: int = 0
  source_positions: dict[str, int] | None = None  # a mixed run's items taken per source
  in_flight: list[str] | None = None  # partial rollouts' samples in flight, per process


def fingerprint(model_config: ModelConfig, value_model: bool, baselines: int = 0
                ) -> dict[str, Any]:
  """What a checkpoint's state shapes depend on; a resume must match it."""
  skip = SPEED_FIELDS + ("bos_token_id", "eos_token_id", "pad_token_id", "lora_dropout")
  if not model_config.has_lora:  # absent: the checkpoints of earlier versions keep matching
    skip += ("lora_rank", "lora_alpha", "lora_targets", "base_quant")
  out = {"model": {k: v for k, v in dataclasses.asdict(model_config).items() if k not in skip},
         "param_layout": models.PARAM_LAYOUT, "value_model": value_model}
  if baselines:  # absent otherwise: the checkpoints of earlier versions keep matching
    out["baselines"] = baselines
  return json.loads(json.dumps(out))  # as the checkpoint's JSON holds it (tuples as lists)


def _without_speed_fields(saved: dict[str, Any] | None) -> dict[str, Any] | None:
  """A checkpoint's fingerprint without SPEED_FIELDS (earlier versions recorded moe_impl)."""
  if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
    return saved
  return {**saved, "model": {k: v for k, v in saved["model"].items() if k not in SPEED_FIELDS}}


def run_identity(config) -> dict[str, Any]:
  """The config's algorithm and model as JSON values: what a checkpoint records of its run."""
  model = {k: v for k, v in config.model.to_dict().items() if k not in SPEED_FIELDS}
  algo = config.algo.copy_and_resolve_references().to_dict()
  identity = {"algo": algo, "model": model, "lora": config.lora.to_dict()}
  if len(config.sources):  # each source's per-row algorithm (weights and data may change)
    identity["sources"] = {name: s.algo.to_dict() for name, s in config.sources.items()}
  return json.loads(json.dumps(identity))


def with_defaults(saved, defaults):
  """`saved` (a checkpoint's `run_identity`) with the fields it lacks taken from `defaults`:
  a field added to the schema after the checkpoint was written had its default's effect."""
  if not (isinstance(saved, dict) and isinstance(defaults, dict)):
    return saved
  return {**defaults, **{k: with_defaults(v, defaults.get(k)) for k, v in saved.items()}}


def differences(saved, wanted, prefix="") -> list[str]:
  """['model.hidden_size: 64 in the checkpoint, 32 in this config', ...] for two records."""
  if isinstance(saved, dict) and isinstance(wanted, dict):
    return [d for k in sorted(set(saved) | set(wanted))
            for d in differences(saved.get(k), wanted.get(k), f"{prefix}{k}.")]
  if saved == wanted or (isinstance(saved, list) and tuple(saved) == wanted):
    return []
  return [f"{prefix[:-1]}: {saved!r} in the checkpoint, {wanted!r} in this config"]


def open_checkpoints(workdir: str, config, plan: Plan, allow_changes: bool = False
                     ) -> tuple[checkpoints.Checkpointer, int | None]:
  """The workdir's checkpoints for this run and the step to resume (None: a fresh start).

  Refuses (`ConfigError`, one line; nothing written) a workdir whose latest checkpoint
  this config cannot or should not resume (`check`).
  """
  ckpt = checkpoints.Checkpointer(workdir, config.checkpoint)
  try:
    return ckpt, check(ckpt, config, plan, workdir, allow_changes)
  except ConfigError:
    ckpt.close()
    raise


def check(ckpt: checkpoints.Checkpointer, config, plan: Plan, workdir: str,
          allow_changes: bool = False) -> int | None:
  """Refuses (`ConfigError`, one line) a workdir whose latest checkpoint this config cannot
  or should not resume; returns that checkpoint's step (None: a fresh start)."""
  latest = ckpt.latest_step()
  if latest is None:
    return None
  meta = ckpt.read_meta(latest)
  wanted = fingerprint(setup_lib.policy_config(config), plan.value_model, plan.baselines)
  saved_shapes = _without_speed_fields(meta.get("fingerprint"))
  if saved_shapes != wanted:
    raise ConfigError(f"the checkpoint at step {latest} in {workdir!r} was written by an "
                      "incompatible config: "
                      f"{'; '.join(differences(saved_shapes, wanted))}; "
                      "expected the same model (or a fresh workdir)")
  saved = with_defaults(meta.get("run", run_identity(config)), run_identity(schema.base_config()))
  changed = differences(saved, run_identity(config))
  if changed and not allow_changes:
    raise ConfigError(f"the checkpoint at step {latest} in {workdir!r} was written by another "
                      f"algorithm or model: config.{'; config.'.join(changed)}; expected the "
                      "same config.algo and config.model (pass --resume_with_changes to resume "
                      "with these changes, or use a fresh workdir)")
  return latest


def start_point(setup: setup_lib.Setup, ckpt: checkpoints.Checkpointer, latest: int | None,
                seed: int) -> Start:
  """A fresh state (`setup.fresh_state`), or checkpoint `latest` restored into the layout."""
  if latest is None:
    return Start(setup_lib.fresh_state(setup, seed))
  saved_base = ckpt.read_meta(latest).get("base_fingerprint")
  if saved_base != setup.base_fingerprint:
    raise ConfigError(f"the checkpoint at step {latest} trained LoRA adapters on a base whose "
                      f"fingerprint is {saved_base}, but this run's base has "
                      f"{setup.base_fingerprint}: expected the same base model (or a fresh "
                      "workdir)")
  state, meta = ckpt.restore(latest, setup.layout)
  return Start(state, int(meta["step"]), int(meta["data_position"]),
               int(meta.get("skipped_steps", 0)), int(meta.get("consecutive_skips", 0)),
               meta.get("source_positions"), meta.get("in_flight"))
