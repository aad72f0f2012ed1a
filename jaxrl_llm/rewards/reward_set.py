"""The weighted set of reward functions a config names.

A reward function is a plain Python callable

  fn(prompts: list[str], completions: list[str], **fields) -> list[float]

where `fields` are the dataset's other columns (`answer`, `numbers`, ...), each a
list aligned with `prompts`. Functions are named in `config.rewards.functions`
by import path (`"jaxrl_llm.rewards.arithmetic:arithmetic_exact"` or
`"path/to/file.py:fn"`) and resolved by `jaxrl_llm.import_path`; a function
that does not use a field takes `**unused_fields`.

`RewardSet` calls every function on a batch, checks what comes back, and
returns the weighted total per sample plus each function's own values. A
function that raises, returns the wrong number of values, or returns a value
that is not a finite real number stops the run with a `RewardError` naming the
function's import path, the sample index and that sample's prompt and completion.
"""
import dataclasses
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

  def __init__(self, functions: Sequence[str], weights: Sequence[float]):
    """Resolves the functions.

    Args:
      functions: import paths, e.g. `("jaxrl_llm.rewards.arithmetic:arithmetic_exact",)`.
      weights: one finite float per function.

    Raises:
      ValueError: no functions, or weights that do not match them.
      (and whatever `import_path.load_function` raises for a bad path)
    """
    functions, weights = tuple(functions), tuple(weights)
    if not functions:
      raise ValueError(
          "No reward functions: set config.rewards.functions to import paths such as "
          "('jaxrl_llm.rewards.arithmetic:arithmetic_exact',).")
    if len(weights) != len(functions):
      raise ValueError(
          f"config.rewards.weights has {len(weights)} values for {len(functions)} "
          f"functions {functions}; give exactly one weight per function.")
    for path, w in zip(functions, weights):
      if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
        raise ValueError(f"Reward weight {w!r} for {path!r} is not a finite number.")
    self.paths = functions
    self.weights = tuple(float(w) for w in weights)
    self.fns = tuple(import_path.load_function(p) for p in functions)
    self.names = tuple(_short_names(self.paths, self.fns))

  @classmethod
  def from_config(cls, rewards_cfg) -> "RewardSet":
    """Builds from `config.rewards` (`functions`, `weights`)."""
    return cls(rewards_cfg.functions, rewards_cfg.weights)

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
      values = _call_checked(path, fn, prompts, completions, fields)
      per_function[name] = values
      total += np.float32(weight) * values
    return Rewards(total=total, per_function=per_function)


def _sample_text(prompts, completions, i) -> str:
  return f"prompt={_show(prompts[i])}, completion={_show(completions[i])}"


def _call_checked(path, fn, prompts, completions, fields) -> np.ndarray:
  """Calls one reward function and validates its values; float32 [B]."""
  size = len(prompts)
  who = f"Reward function {path!r} (config.rewards.functions)"
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
