"""Resolves a user function named in a config by import path.

A config names a built-in choice by a short string that a plain table looks up
(`config.algo.advantage.estimator = 'grpo'`). A user's own function is named
explicitly by import path instead, and this module is the one place that turns
such a path into a callable:

  'my_pkg.rewards:exact_match'          # an importable module, then an attribute
  'path/to/my_rewards.py:exact_match'   # a Python file, then an attribute

The attribute part may be dotted (`'pkg.mod:Class.method'`). Every failure
raises an error that names the path and says what was missing; given the config field
that holds the path (`field='config.rewards.functions[0]'`), one `ImportPathError` (a
`ValueError`) that names the field first.
"""
import functools
import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Any, Callable


def _split(spec: str) -> tuple[str, str]:
  """Splits 'module_or_file:attr' at its last colon."""
  if not isinstance(spec, str) or ":" not in spec:
    raise ValueError(
        f'Import path {spec!r} must look like "pkg.module:function" or '
        '"path/to/file.py:function".')
  where, _, attr = spec.rpartition(":")
  if not where or not attr:
    raise ValueError(
        f'Import path {spec!r} must look like "pkg.module:function" or '
        '"path/to/file.py:function" (empty module or function name).')
  return where, attr


def _is_file(where: str) -> bool:
  return where.endswith(".py") or os.sep in where or "/" in where


def _load_file(path: str):
  """Imports a Python file under a name unique to its absolute path."""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Import path names file {path!r}, which does not exist.")
  digest = hashlib.sha1(path.encode()).hexdigest()[:12]
  name = f"_jaxrl_llm_user_{os.path.splitext(os.path.basename(path))[0]}_{digest}"
  if name in sys.modules:
    return sys.modules[name]
  module_spec = importlib.util.spec_from_file_location(name, path)
  if module_spec is None or module_spec.loader is None:
    raise ImportError(f"Cannot import {path!r} as a Python module.")
  module = importlib.util.module_from_spec(module_spec)
  sys.modules[name] = module
  try:
    module_spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise
  return module


def _load_module(name: str):
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    raise ModuleNotFoundError(
        f"Import path names module {name!r}, which cannot be imported: {e}") from e


class ImportPathError(ValueError):
  """An import path in a config field that does not name a callable (`load_function`
  with `field`): one line naming the field, the path and what is wrong."""


def load_function(spec: str, field: str = "") -> Callable[..., Any]:
  """Returns the callable that `spec` names.

  Args:
    spec: `"pkg.module:function"` (imported with `importlib`) or
      `"path/to/file.py:function"` (a file path, relative to the working
      directory or absolute). The part after the last colon may be dotted.
    field: the config field that holds `spec` (`'config.data.env'`), named by any error.

  Returns:
    The callable. Results are cached per `spec`.

  Raises:
    ImportPathError: with `field`, for any of the failures below.
    ValueError: `spec` is not of the form `where:name`.
    FileNotFoundError / ModuleNotFoundError: the file or module is missing.
    AttributeError: the module has no such attribute.
    TypeError: the attribute is not callable.
  """
  if not field:
    return _load(spec)
  try:
    return _load(spec)
  except Exception as e:  # noqa: BLE001 -- a user's file may raise anything as it loads
    message = " ".join(str(e).split()).rstrip(".")
    if not isinstance(e, (ValueError, ImportError, OSError, AttributeError, TypeError)):
      message = f"importing it raised {type(e).__name__}: {message}"
    expected = ("" if "must look like" in message else
                ': expected "pkg.module:function" or "path/to/file.py:function" naming a '
                "function that exists")
    raise ImportPathError(f"{field}={spec!r}: {message}{expected}") from e


@functools.lru_cache(maxsize=None)
def _load(spec: str) -> Callable[..., Any]:
  where, attr = _split(spec)
  module = _load_file(where) if _is_file(where) else _load_module(where)
  obj = module
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise AttributeError(
          f"Import path {spec!r}: {where!r} has no attribute {attr!r}.")
    obj = getattr(obj, part)
  if not callable(obj):
    raise TypeError(
        f"Import path {spec!r} names an object of type {type(obj).__name__}, not a function.")
  return obj
