"""The policy `launch.evaluate` evaluates: a Hugging Face directory or a training workdir's
checkpoint (`--model=DIR` or `--model=WORKDIR[:STEP]`).

A directory holding `checkpoints/` is a workdir (its latest step, or STEP), else it must be
a Hugging Face directory (config.json and safetensors weights: a run's `export/`, a
downloaded model). A workdir's checkpoint is restored into the policy's layout on the
config's mesh, its policy parameters only (not the optimizer's moments or a critic). Its
architecture is the run's: `config.model` and `config.lora` as the checkpoint recorded
them (`resume.run_identity`; a checkpoint without that record: WORKDIR/config.json, the
config the run last started with), the speed settings (`resume.SPEED_FIELDS`) left as
the given config has them; the checkpoint's fingerprint must then match. With LoRA the
adapters join the run's base (`config.model.path`, which must be the base they were
trained on: its fingerprint is checked) and decode merged, as during training.
"""
from __future__ import annotations

import dataclasses
import json

from jaxrl_llm import checkpoints, data, models, paths
from jaxrl_llm.config.errors import ConfigError
from jaxrl_llm.models import load, lora
from jaxrl_llm.training import resume
from jaxrl_llm.training import setup as setup_lib

_EXPECTED = ("expected a Hugging Face model directory (config.json and safetensors weights) "
             "or a training workdir (holding checkpoints/), WORKDIR[:STEP]")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """What `--model` names.

  Attributes:
    path: the directory.
    workdir: whether it is a training workdir (else a Hugging Face directory).
    step: a workdir's checkpoint step (None: its latest).
  """
  path: str
  workdir: bool
  step: int | None = None


def parse_model(spec: str) -> ModelSpec:
  """`--model`'s value checked (`ConfigError`, one line, for a missing or unusable one)."""
  path, colon, tail = spec.rpartition(":")
  step = int(tail) if colon and path and tail.isdigit() else None
  path = path if step is not None else spec
  if not spec or not paths.isdir(path):
    raise ConfigError(f"--model={spec!r}: {path!r} is not a directory: {_EXPECTED}")
  if paths.isdir(paths.join(path, "checkpoints")):
    return ModelSpec(path, True, step)
  if step is not None:
    raise ConfigError(f"--model={spec!r}: {path!r} holds no checkpoints/, so it has no step "
                      f"{step}: {_EXPECTED}")
  try:
    load.check_model_dir(path)
  except (OSError, ValueError) as e:
    raise ConfigError(f"--model={spec!r}: {' '.join(str(e).split())}: {_EXPECTED}") from e
  return ModelSpec(path, False)


def pick_step(spec: ModelSpec) -> int | None:
  """The checkpoint step a workdir's `spec` names: `spec.step` if the workdir has it, else
  its latest (None for a Hugging Face directory)."""
  if not spec.workdir:
    return None
  reader = checkpoints.Reader(spec.path)
  try:
    steps = reader.steps()
  finally:
    reader.close()
  if not steps:
    raise ConfigError(f"--model={spec.path!r}: its checkpoints/ holds no checkpoint: expected "
                      "a workdir a run has checkpointed (or its export/)")
  if spec.step is None:
    return steps[-1]
  if spec.step not in steps:
    raise ConfigError(f"--model={spec.path}:{spec.step}: the workdir has no checkpoint of step "
                      f"{spec.step}: expected one of {steps}")
  return spec.step


def _overlay(group, saved: dict, skip=()) -> None:
  """`group`'s fields set from `saved` (the fields both have, but `skip`)."""
  for key, value in saved.items():
    if key in skip or key not in group:
      continue
    if isinstance(value, dict):
      _overlay(group[key], value)
    else:
      group[key] = value


def with_model(config, spec: ModelSpec, step: int | None):
  """A copy of `config` with the model `spec` names: `model.path` the Hugging Face directory,
  or a workdir's run's `model` and `lora` (the checkpoint of `step`'s record, else the
  workdir's config.json), the config's speed settings kept."""
  config = config.copy_and_resolve_references()
  if not spec.workdir:
    config.model.path = spec.path
    return config
  saved = _read_meta(spec.path, step).get("run")
  if saved is None and paths.isfile(paths.join(spec.path, "config.json")):
    saved = json.loads(paths.read_text(paths.join(spec.path, "config.json")))
  if saved:
    _overlay(config.model, saved.get("model", {}), resume.SPEED_FIELDS)
    _overlay(config.lora, saved.get("lora", {}))
  return config


def _read_meta(workdir: str, step: int) -> dict:
  reader = checkpoints.Reader(workdir)
  try:
    return reader.read_meta(step)
  finally:
    reader.close()


def _check_fingerprint(meta: dict, policy_config, where: str) -> None:
  """The checkpoint's recorded architecture is `policy_config`'s (speed settings aside)."""
  drop = lambda fp: {k: v for k, v in (fp or {}).get("model", {}).items()
                     if k not in resume.SPEED_FIELDS}
  saved = meta.get("fingerprint") or {}
  wanted = resume.fingerprint(policy_config, bool(saved.get("value_model")),
                              int(saved.get("baselines", 0)))
  changed = resume.differences(drop(saved), drop(wanted))
  if changed:
    raise ConfigError(f"{where} was written for another architecture: model."
                      f"{'; model.'.join(changed)}; expected config.model (the run's, as its "
                      "checkpoint or config.json records it) to describe it")


def load_policy(config, spec: ModelSpec, step: int | None, mesh, rules):
  """(tokenizer, policy): the model `spec` names (a workdir's checkpoint of `step`,
  `pick_step`), placed on `mesh`; `config` is `with_model`'s."""
  if not spec.workdir:
    return setup_lib.load_tokenizer_and_policy(config, mesh, rules)
  reader = checkpoints.Reader(spec.path)
  try:
    where = f"the checkpoint of step {step} in {spec.path!r}"
    meta = reader.read_meta(step)
    cfg = setup_lib.policy_config(config)
    _check_fingerprint(meta, cfg, where)
    abstract = models.abstract_params(cfg, mesh, rules)
    if not cfg.has_lora:
      params = reader.restore_part(step, {"policy_params": abstract})["policy_params"]
      return data.run_tokenizer(config.model), models.Model(params, cfg, mesh, rules)
    tokenizer, base = setup_lib.load_tokenizer_and_policy(config, mesh, rules)
    if cfg.base_quant == "int8":
      base = models.quantize_base(base)
    if meta.get("base_fingerprint") != lora.fingerprint(base.params):
      raise ConfigError(f"{where} trained LoRA adapters on another base than config.model.path="
                        f"{config.model.path!r}: expected the base the run trained on")
    adapters = reader.restore_part(step, {"policy_params": lora.split(abstract)[1]})
    params = lora.join(base.params, adapters["policy_params"])
    return tokenizer, models.Model(params, cfg, mesh, rules)
  finally:
    reader.close()
