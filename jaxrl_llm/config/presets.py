"""Presets: experiment files that change the schema's defaults, loaded by name or path.

A preset is a Python file defining `get_config(arg=None)`; the repository's are in
`configs/` (installed with the package as `jaxrl_llm/presets/`, so they load by name
after a plain `pip install` too). Most are one call to `make_preset`:

  from jaxrl_llm.config import make_preset, ref

  def get_config(arg=None):
    return make_preset(arg, {
        "algo.loss.trust_region": "clip",
        "algo.loss.norm_length": ref("sampling.max_new_tokens"),  # follows an override
    }, local={"algo.num_minibatches": 2})

`load("grpo:runlocal")` (a name) or `load("path/to/file.py:arg")` returns a config
(`jaxrl_llm.config.preset`).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

import ml_collections

from jaxrl_llm.config import schema

ConfigDict = ml_collections.ConfigDict
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../jaxrl_llm


def parse_arg(arg: str | None, *, lazy: bool = False, **spec) -> ConfigDict:
  """Parses `get_config`'s single string argument, big_vision style.

  `arg` is a comma-separated list of `key=value` or bare `key` (meaning True), e.g.
  `"runlocal,samples=4"`. Every key must appear in `spec`, whose values are the
  defaults and fix each key's type.

  Args:
    arg: the string after the colon in `--config=configs/grpo.py:runlocal`.
    lazy: accept keys not in `spec` (as strings).
    **spec: defaults, e.g. `runlocal=False`.

  Returns:
    A ConfigDict with one entry per key of `spec` (and, if lazy, of `arg`).
  """
  parsed = ConfigDict(dict(spec))
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    key = key.strip()
    if key not in spec and not lazy:
      raise ValueError(f"Unknown config argument {key!r}; valid: {sorted(spec)}.")
    default = spec.get(key, "")
    if not sep:
      parsed[key] = True
    elif isinstance(default, bool):
      parsed[key] = value.lower() in ("1", "true", "yes")
    else:
      parsed[key] = type(default)(value)
  return parsed


class ref:  # pylint: disable=invalid-name  (reads as a function in a preset's table)
  """A field that follows another one (`ConfigDict.get_ref`), e.g. `ref("sampling.max_new_tokens")`;
  `ref(...) // 5` follows a fifth of it."""

  def __init__(self, path: str, ops: tuple = ()):
    self.path, self.ops = path, ops

  def __floordiv__(self, k: int) -> "ref":
    return ref(self.path, self.ops + (k,))

  def resolve(self, config: ConfigDict):
    *groups, name = self.path.split(".")
    node = config
    for group in groups:
      node = node[group]
    value = node.get_ref(name)
    for k in self.ops:
      value = value // k
    return value


def set_fields(config: ConfigDict, changes: dict[str, Any]) -> ConfigDict:
  """Sets dotted fields (`"algo.kl.coef": 0.0`); a `ref` becomes a field reference."""
  for path, value in changes.items():
    *groups, name = path.split(".")
    node = config
    for group in groups:
      node = node[group]
    node[name] = value.resolve(config) if isinstance(value, ref) else value
  return config


def make_preset(arg: str | None, changes: dict[str, Any], *, local: dict[str, Any] | None = None,
                base: str = "", runlocal: bool = True) -> ConfigDict:
  """The skeleton every preset shares: a locked full config with `changes` applied.

  Args:
    arg: `get_config`'s argument; it takes `runlocal` (small enough for a laptop CPU:
      `schema.shrink_for_local`, then `local`), or nothing when `runlocal` is False.
    changes: dotted field -> value (or `ref`), what makes this preset.
    local: further changes for `runlocal`.
    base: another preset's name to start from instead of `schema.base_config()`.
  """
  parsed = parse_arg(arg, runlocal=False) if runlocal else parse_arg(arg)
  config = load(base) if base else schema.base_config()
  set_fields(config, changes)
  if runlocal and parsed.runlocal:
    schema.shrink_for_local(config)
    set_fields(config, local or {})
  return schema.finalize(config)


def directory() -> str:
  """Where the presets are: `configs/` in a checkout, `jaxrl_llm/presets/` installed."""
  checkout = os.path.join(os.path.dirname(_PACKAGE), "configs")
  if os.path.isfile(os.path.join(checkout, "grpo.py")):
    return checkout
  return os.path.join(_PACKAGE, "presets")


def names() -> list[str]:
  return sorted(f[:-3] for f in os.listdir(directory())
                if f.endswith(".py") and not f.startswith("_"))


def path(spec: str) -> str:
  """The file of a preset name (`grpo`) or path (`configs/grpo.py`), without the `:arg`."""
  if spec.endswith(".py") or os.sep in spec:
    if not os.path.isfile(os.path.expanduser(spec)):
      raise ValueError(f"config file {spec!r} does not exist: expected an existing file "
                       f"(path/to/file.py[:arg]) or a preset name, one of {', '.join(names())}")
    return spec
  file = os.path.join(directory(), spec + ".py")
  if not os.path.isfile(file):
    raise ValueError(f"config {spec!r} is neither a file nor a preset name: expected one of "
                     f"{', '.join(names())}, or a path ending in .py")
  return file


def load_module(name: str):
  """A preset file as a module (for its helpers, e.g. arithmetic's `apply`)."""
  file = path(name)
  module_name = "jaxrl_llm_preset_" + os.path.splitext(os.path.basename(file))[0]
  module_spec = importlib.util.spec_from_file_location(module_name, file)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def load(spec: str) -> ConfigDict:
  """A preset's config: `NAME[:ARG]` or `PATH.py[:ARG]` (e.g. `"grpo:runlocal"`)."""
  name, _, arg = spec.partition(":")
  return load_module(name).get_config(arg or None)
