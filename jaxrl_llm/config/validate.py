"""Checks of a config and the run's surroundings that need no model or data: they run
first, so a bad value fails in seconds with a message naming the field, the value and
what was expected, not an hour into a run.
"""
from __future__ import annotations

import difflib
import math

import jax
import ml_collections
from absl import logging

from configs import common as config_schema
from jaxrl_llm import objectives, paths, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.data import char_tokenizer
from jaxrl_llm.data import prompts as prompts_lib
from jaxrl_llm.models import config as model_config
from jaxrl_llm.models import load as model_load
from jaxrl_llm.training import rollout as rollout_lib
from jaxrl_llm.training import state as state_lib


def validate_config(config, devices=None) -> None:
  """Every check that needs no data or model, before anything is loaded.

  Args:
    config: the full config.
    devices: the devices of the mesh (default: all devices of all processes).
  """
  check_known_keys(config)
  objectives.validate_algo(config.algo, config.sampling.num_samples)
  state_lib.check_optimizer_config(config.optimizer)
  t, algo, G = config.train, config.algo, config.sampling.num_samples
  positive = {"train.steps": t.steps, "train.prompts_per_step": t.prompts_per_step,
              "train.micro_batch_size": t.micro_batch_size, "sampling.num_samples": G,
              "sampling.max_new_tokens": config.sampling.max_new_tokens,
              "algo.num_iterations": algo.num_iterations,
              "algo.num_minibatches": algo.num_minibatches,
              "train.logprob_chunk_size": t.logprob_chunk_size}
  for name, value in positive.items():
    if int(value) < 1:
      raise ValueError(f"config.{name}={value}: expected a positive integer")
  B = t.prompts_per_step * G
  if B % algo.num_minibatches:
    raise ValueError(f"config.algo.num_minibatches={algo.num_minibatches} does not divide the "
                     f"rollout batch of {B} sequences (train.prompts_per_step x sampling.num_samples)")
  mb = B // algo.num_minibatches
  if mb % min(t.micro_batch_size, mb):
    raise ValueError(f"config.train.micro_batch_size={t.micro_batch_size} does not divide the "
                     f"minibatch of {mb} sequences")
  for name, allowed in (("layer_loop", sampling.LAYER_LOOPS),
                        ("weight_layout", sampling.WEIGHT_LAYOUTS)):
    if config.sampling[name] not in allowed:
      raise ValueError(f"config.sampling.{name}={config.sampling[name]!r}: expected one of "
                       f"{list(allowed)}")
  if config.data.completions not in rollout_lib.COMPLETION_SOURCES:
    raise ValueError(f"config.data.completions={config.data.completions!r}: expected one of "
                     f"{list(rollout_lib.COMPLETION_SOURCES)}")
  if config.data.prompt_overflow not in prompts_lib.OVERFLOW_MODES:
    raise ValueError(f"config.data.prompt_overflow={config.data.prompt_overflow!r}: expected one "
                     f"of {list(prompts_lib.OVERFLOW_MODES)}")
  if t.prompts_per_step % jax.process_count():
    raise ValueError(f"config.train.prompts_per_step={t.prompts_per_step} is not divisible by the "
                     f"{jax.process_count()} processes: expected a multiple of "
                     f"{jax.process_count()} (each process loads its own share of the prompts)")
  if algo.max_async_level > 0 and jax.process_count() > 1:
    raise ValueError(f"config.algo.max_async_level={algo.max_async_level} with "
                     f"{jax.process_count()} processes: asynchronous rollouts run in one "
                     "process; expected 0")
  _check_batch_shards(config, devices)
  _check_model(config.model)


# --- keys -----------------------------------------------------------------------------------------
def _is_group(value) -> bool:
  return isinstance(value, (ml_collections.ConfigDict, dict))


def check_known_keys(config, schema=None) -> None:
  """Raises if `config`'s keys differ from the schema's (default `base_config()`).

  A locked preset already rejects a misspelt key when it is set; a config built unlocked
  (or by hand) does not, and the trainer would silently ignore the typo. A group that is
  empty in the schema (`data.task_options`) takes any keys.
  """
  errors: list[str] = []
  _compare_keys(config, config_schema.base_config() if schema is None else schema, "config",
                errors)
  if errors:
    raise ValueError("\n".join(errors))


def unknown_key(path: str, schema=None) -> str | None:
  """The error for a dotted config path (`train.stepz`) that the schema lacks, else None.

  For command-line overrides (`--config.train.stepz=3`), which ml_collections rejects
  before any config object exists. Keys under a group that is empty in the schema
  (`data.task_options`) are free-form: None.
  """
  node, prefix = config_schema.base_config() if schema is None else schema, "config"
  for key in path.split("."):
    if not _is_group(node) or not len(node):
      return None
    if key not in node:
      return _unknown_key_message(key, node, prefix)
    node, prefix = node[key], f"{prefix}.{key}"
  return None


def _unknown_key_message(key: str, schema, prefix: str) -> str:
  close = difflib.get_close_matches(key, list(schema.keys()), n=1)
  hint = f"did you mean {prefix}.{close[0]}?" if close else f"expected one of {sorted(schema.keys())}"
  return f"{prefix}.{key} is not a known key; {hint}"


def _compare_keys(config, schema, prefix: str, errors: list[str]) -> None:
  for key in config.keys():
    name = f"{prefix}.{key}"
    if key not in schema:
      errors.append(_unknown_key_message(key, schema, prefix))
    elif _is_group(schema[key]) and len(schema[key]):
      if _is_group(config[key]):
        _compare_keys(config[key], schema[key], name, errors)
      else:
        errors.append(f"{name}={config[key]!r}: expected a group with keys "
                      f"{sorted(schema[key].keys())}")
  for key in schema.keys():
    if key not in config:
      errors.append(f"{prefix}.{key} is missing; configs.common.base_config() sets it")


# --- mesh and batch -------------------------------------------------------------------------------
def _check_batch_shards(config, devices) -> None:
  """The rollout rows split evenly over the mesh axes the 'batch' rule names."""
  mesh, _ = sh.split_meshes(config.mesh, devices)  # raises for a shape that does not fit
  rules = sh.freeze_rules(config.mesh.rules)
  sh.logical_to_spec((sh.BATCH,), (1,), mesh, rules)  # raises for an unknown axis in the rules
  axes = dict(rules).get(sh.BATCH) or ()
  axes = (axes,) if isinstance(axes, str) else axes
  shards = math.prod(mesh.shape[a] for a in axes)
  P, G = config.train.prompts_per_step, config.sampling.num_samples
  sizes = " x ".join(f"{a}={mesh.shape[a]}" for a in axes)
  if (P * G) % shards:
    raise ValueError(
        f"config.train.prompts_per_step={P} x config.sampling.num_samples={G} = {P * G} rollout "
        f"rows do not split over the {shards} batch shards of the mesh ({sizes}, the axes "
        f"config.mesh.rules maps 'batch' to): expected a multiple of {shards}")
  minibatches = config.algo.num_minibatches
  if (P * G // minibatches) % shards:  # runs, but some devices repeat others' work
    logging.warning(
        "config.algo.num_minibatches=%d cuts the %d rollout rows into minibatches of %d, which "
        "do not split over the %d batch shards of the mesh (%s): each minibatch is split over "
        "fewer devices (replicated on the others); minibatches of a multiple of %d rows use "
        "every device", minibatches, P * G, P * G // minibatches, shards, sizes, shards)


# --- model and tokenizer --------------------------------------------------------------------------
def _check_model(m) -> None:
  for name, allowed in (("remat", model_config.REMAT_POLICIES),
                        ("attention", model_config.ATTENTION_IMPLS)):
    if m[name] not in allowed:
      raise ValueError(f"config.model.{name}={m[name]!r}: expected one of {list(allowed)}")
  if m.path:
    try:
      model_config.from_hf_dict(model_load.check_model_dir(m.path))
    except (OSError, ValueError) as e:
      error = FileNotFoundError if isinstance(e, OSError) else ValueError
      raise error(f"config.model.path={m.path!r}: {e}") from e
  if m.tokenizer_path and not paths.isdir(m.tokenizer_path):
    raise FileNotFoundError(f"config.model.tokenizer_path={m.tokenizer_path!r} is not a "
                            "directory: expected a tokenizer directory, local or gs:// "
                            "('' = model.path)")
  needed = len(char_tokenizer.vocab())
  if not m.path and not m.tokenizer_path and m.arch.vocab_size < needed:
    raise ValueError(f"config.model.arch.vocab_size={m.arch.vocab_size} is smaller than the "
                     f"built-in character tokenizer's {needed} tokens: expected >= {needed}, "
                     "or set config.model.tokenizer_path")


# --- workdir --------------------------------------------------------------------------------------
def check_writable(workdir: str) -> None:
  """Writes and removes a probe file: a bad workdir (a missing bucket, no permission)
  fails here, before the model loads."""
  try:
    paths.makedirs(workdir)
    probe = paths.join(workdir, f".write_test.{jax.process_index()}")  # one per process
    with paths.open(probe, "w") as f:
      f.write("ok")
    paths.remove(probe)
  except (OSError, ValueError) as e:  # gcsfs raises ValueError for some bad bucket names
    raise ValueError(f"workdir {workdir!r} cannot be written ({type(e).__name__}: {e}): expected "
                     "a directory this process can create and write to") from e
