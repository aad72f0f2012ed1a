"""The weighted set of reward functions a config names.

A reward function is a plain Python callable

  fn(prompts: list[str], completions: list[str], **fields) -> list[float]

where `fields` are the dataset's other columns (`answer`, `numbers`, ...), each a
list aligned with `prompts`. Functions are named in `config.rewards.functions`
by import path (`"jaxrl_llm.rewards.arithmetic:arithmetic_exact"` or
`"path/to/file.py:fn"`) and resolved by `jaxrl_llm.import_path`; a function
that does not use a field takes `**unused_fields`.

The fields a function reads are its parameters after the first two that have no
default (`answer` above); `RewardSet.missing_fields` compares them with a record's
fields, so data that lacks one is refused before anything loads
(`jaxrl_llm.config.inputs`). A set may be empty, where an environment's step rewards
or a teacher carry the signal: its total is 0.

`RewardSet` calls every function on a batch, checks what comes back, and
returns the weighted total per sample plus each function's own values. A
function that raises, returns the wrong number of values, or returns a value
that is not a finite real number stops the run with a `RewardError` naming the
function's import path, the sample index and that sample's prompt and completion.
"""
import dataclasses
import inspect
import math
import numbers
from typing import Callable, Sequence

import numpy as np

from jaxrl_llm import import_path

_SHOW_CHARS = 200  # prompt/completion characters quoted in an error
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class RewardError(ValueError):
  """A reward function failed or returned an unusable value."""


@dataclasses.dataclass(frozen=True)
class Rewards:
  """Rewards for one batch.

  Attributes:
    total: float32 [B], the weighted sum over functions.
    per_function: short name -> float32 [B], each function's unweighted values.
  """
  total: np.ndarray
  per_function: dict[str, np.ndarray]

  def means(self, prefix: str = "reward/") -> dict[str, float]:
    """Batch means for logging: `{prefix + name: mean}` plus `{prefix + 'total'}`."""
    out = {prefix + name: float(v.mean()) for name, v in self.per_function.items()}
    out[prefix + "total"] = float(self.total.mean())
    return out


def _show(text) -> str:
  text = str(text)
  if len(text) <= _SHOW_CHARS:
    return repr(text)
  return f"{text[:_SHOW_CHARS]!r}... ({len(text)} characters)"


def _short_names(paths: Sequence[str], fns: Sequence[Callable]) -> list[str]:
  """Metric keys: each function's `__name__`, made unique with a suffix."""
  names = []
  for path, fn in zip(paths, fns):
    base = getattr(fn, "__name__", None) or path.rpartition(":")[2]
    name, k = base, 2
    while name in names:
      name, k = f"{base}_{k}", k + 1
    names.append(name)
  return names


class RewardSet:
  """Reward functions with weights; call it on a batch to get `Rewards`."""

  def __init__(self, functions: Sequence[str], weights: Sequence[float],
               field: str = "config.rewards", bound: dict | None = None):
    """Resolves the functions.

    Args:
      functions: import paths, e.g. `("jaxrl_llm.rewards.arithmetic:arithmetic_exact",)`;
        none: every total is 0 (the signal comes from elsewhere).
      weights: one finite float per function.
      field: the config group that names them (`config.sources.NAME.rewards`), for errors.
      bound: {import path: callable} taking the place of the function a path names (the
        run's judge, whose path names a placeholder: `rewards.judge`).

    Raises:
      ValueError: weights that do not match the functions, or a path that does not
        resolve (`import_path.ImportPathError`, naming `FIELD.functions[i]`).
    """
    functions, weights = tuple(functions), tuple(weights)
    if len(weights) != len(functions):
      raise ValueError(
          f"{field}.weights has {len(weights)} values for {len(functions)} "
          f"functions {functions}; give exactly one weight per function.")
    for path, w in zip(functions, weights):
      if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
        raise ValueError(f"{field}.weights: {w!r} for {path!r} is not a finite number.")
    self.paths, self.field = functions, field
    self.weights = tuple(float(w) for w in weights)
    bound = bound or {}
    self.fns = tuple(bound[p] if p in bound else
                     import_path.load_function(p, field=f"{field}.functions[{i}]")
                     for i, p in enumerate(functions))
    # A bound function is named by its path, as the function it stands for.
    self.names = tuple(_short_names(self.paths, [None if p in bound else fn
                                                 for p, fn in zip(self.paths, self.fns)]))

  @classmethod
  def from_config(cls, rewards_cfg, field: str = "config.rewards",
                  bound: dict | None = None) -> "RewardSet":
    """Builds from `config.rewards` (`functions`, `weights`); `field`: where it is."""
    return cls(rewards_cfg.functions, rewards_cfg.weights, field, bound)

  def missing_fields(self, fields) -> list[tuple[str, str]]:
    """(function's import path, field) for each field a function reads that is not among
    `fields` (a record's keys besides `prompt`, plus what the trainer adds)."""
    return [(path, name) for path, fn in zip(self.paths, self.fns)
            for name in fields_read(fn)[0] if name not in fields]

  def unexpected_fields(self, fields) -> list[tuple[str, str]]:
    """(function's import path, field) for each of `fields` that a function without a
    `**fields` parameter does not take (calling it would raise TypeError)."""
    return [(path, name) for path, fn in zip(self.paths, self.fns)
            if (takes := fields_read(fn)[1]) is not None
            for name in fields if name not in takes]

  def __call__(self, prompts: Sequence[str], completions: Sequence[str],
               **fields: Sequence) -> Rewards:
    """Scores a batch.

    Args:
      prompts: B prompt strings (a prompt repeats for each of its G samples).
      completions: B decoded completions.
      **fields: the dataset's other columns, each B long and aligned.

    Returns:
      `Rewards` with the weighted total and each function's values.

    Raises:
      ValueError: inputs of different lengths.
      RewardError: a function raised or returned unusable values.
    """
    prompts, completions = list(prompts), list(completions)
    size = len(prompts)
    if len(completions) != size:
      raise ValueError(f"{size} prompts but {len(completions)} completions.")
    fields = {k: list(v) for k, v in fields.items()}
    for key, column in fields.items():
      if len(column) != size:
        raise ValueError(f"Field {key!r} has {len(column)} values for {size} prompts.")
    total = np.zeros([size], np.float32)
    per_function = {}
    for path, name, fn, weight in zip(self.paths, self.names, self.fns, self.weights):
      values = _call_checked(path, fn, prompts, completions, fields, self.field)
      per_function[name] = values
      total += np.float32(weight) * values
    return Rewards(total=total, per_function=per_function)


def _sample_text(prompts, completions, i) -> str:
  return f"prompt={_show(prompts[i])}, completion={_show(completions[i])}"


def fields_read(fn: Callable) -> tuple[tuple[str, ...], frozenset[str] | None]:
  """What `fn(prompts, completions, **fields)` reads: the fields it needs (its parameters
  after the first two that have no default) and those it takes (None: any, `**fields`).
  ((), None) when its signature is unknown."""
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):  # some builtins and C callables
    return (), None
  kind = inspect.Parameter
  positional = [p for p in params if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)]
  named = [p for p in params if p not in positional[:2]  # prompts, completions: by position
           and p.kind in (kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)]
  needed = tuple(p.name for p in named if p.default is kind.empty)
  any_field = any(p.kind == kind.VAR_KEYWORD for p in params)
  return needed, None if any_field else frozenset(p.name for p in named)


def _call_checked(path, fn, prompts, completions, fields, field) -> np.ndarray:
  """Calls one reward function and validates its values; float32 [B]."""
  size = len(prompts)
  who = f"Reward function {path!r} ({field}.functions)"
  try:
    values = fn(list(prompts), list(completions), **{k: list(v) for k, v in fields.items()})
  except Exception as e:  # pylint: disable=broad-except
    i = _first_failing_sample(fn, prompts, completions, fields)
    where = (f"on sample {i} ({_sample_text(prompts, completions, i)})" if i is not None
             else f"on a batch of {size} samples (no single sample fails alone)")
    raise RewardError(f"{who} raised {type(e).__name__}: {e} {where}.") from e
  if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
    raise RewardError(f"{who} returned a {type(values).__name__}, not a list of {size} floats "
                      "(one per sample).")
  values = list(values)
  if len(values) != size:
    detail = (f"; the values stop before sample {len(values)} "
              f"({_sample_text(prompts, completions, len(values))})"
              if len(values) < size else "")
    raise RewardError(f"{who} returned {len(values)} values for {size} samples{detail}; "
                      "expected one per sample.")
  for i, v in enumerate(values):
    # bools count as 0/1; float32 must hold the value too (1e39 would become inf).
    ok = isinstance(v, (numbers.Real, np.bool_))
    if not ok or not abs(float(v)) <= _FLOAT32_MAX:  # also False for nan
      raise RewardError(f"{who} returned {v!r} for sample {i} "
                        f"({_sample_text(prompts, completions, i)}); rewards must be "
                        "finite real numbers.")
  return np.asarray(values, np.float32)


def _first_failing_sample(fn, prompts, completions, fields) -> int | None:
  """Reruns `fn` one sample at a time to find which sample makes it raise."""
  for i in range(len(prompts)):
    try:
      fn([prompts[i]], [completions[i]], **{k: [v[i]] for k, v in fields.items()})
    except Exception:  # pylint: disable=broad-except
      return i
  return None
