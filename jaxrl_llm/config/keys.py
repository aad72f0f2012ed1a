"""A config's keys against the schema's: a misspelt or missing key named, with the closest
known one (`check_known_keys` for a config object, `unknown_key` for a command-line path)."""
from __future__ import annotations

import difflib

import ml_collections

from jaxrl_llm.config import schema
from jaxrl_llm.config.errors import ConfigError


# Keys the schema had once, and what replaced them.
REPLACED = {f"config.logging.{name}": f"name {name!r} in config.logging.trackers or leave it "
            "out, e.g. --config.logging.trackers=jsonl" for name in ("tensorboard", "jsonl")}


def is_group(value) -> bool:
  """A config group (a ConfigDict or a dict), not a field."""
  return isinstance(value, (ml_collections.ConfigDict, dict))


def check_known_keys(config, schema_config=None) -> None:
  """Raises if `config`'s keys differ from the schema's (default `base_config()`).

  A locked preset already rejects a misspelt key when it is set; a config built unlocked
  (or by hand) does not, and the trainer would silently ignore the typo. A group that is
  empty in the schema (`data.task_options`) takes any keys.
  """
  errors: list[str] = []
  _compare_keys(config, schema_config or schema.base_config(), "config", errors)
  if errors:
    raise ConfigError("\n".join(errors))


def unknown_key(path: str, schema_config=None) -> str | None:
  """The error for a dotted config path (`train.stepz`) that the schema lacks, else None.

  For command-line overrides (`--config.train.stepz=3`), which ml_collections rejects
  before any config object exists. Keys under a group that is empty in the schema
  (`data.task_options`) are free-form: None.
  """
  node, prefix = schema_config or schema.base_config(), "config"
  for key in path.split("."):
    if prefix == "config.sources":  # a source named by a preset: its keys are source_config's
      node, prefix = schema.source_config(), f"{prefix}.{key}"
      continue
    if not is_group(node) or not len(node):
      return None
    if key not in node:
      return _unknown_key_message(key, node, prefix)
    node, prefix = node[key], f"{prefix}.{key}"
  return None


def _unknown_key_message(key: str, group, prefix: str) -> str:
  close = difflib.get_close_matches(key, list(group.keys()), n=1)
  hint = f"did you mean {prefix}.{close[0]}?" if close else f"expected one of {sorted(group.keys())}"
  hint = REPLACED.get(f"{prefix}.{key}", hint)
  return f"{prefix}.{key} is not a known key; {hint}"


def _compare_keys(config, group, prefix: str, errors: list[str]) -> None:
  for key in config.keys():
    name = f"{prefix}.{key}"
    if prefix == "config.sources":  # each source has the keys of schema.source_config()
      if is_group(config[key]):
        _compare_keys(config[key], schema.source_config(), name, errors)
      else:
        errors.append(f"{name}={config[key]!r}: expected a group like "
                      "jaxrl_llm.config.schema.source_config()")
    elif key not in group:
      errors.append(_unknown_key_message(key, group, prefix))
    elif is_group(group[key]) and len(group[key]):
      if is_group(config[key]):
        _compare_keys(config[key], group[key], name, errors)
      else:
        errors.append(f"{name}={config[key]!r}: expected a group with keys "
                      f"{sorted(group[key].keys())}")
  for key in group.keys():
    if key not in config:
      errors.append(f"{prefix}.{key} is missing; jaxrl_llm.config.base_config() sets it")
