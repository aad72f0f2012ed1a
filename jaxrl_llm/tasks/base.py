"""What a built-in task is, and its deterministic train/eval splits.

A task draws one problem from a `random.Random` (`make(rng) -> record`, a dict
with a `prompt` and the fields its rewards check). Splits come from a seed:

- `eval` is the first `num_eval` distinct problems drawn from the generators
  seeded `"<task>/<seed>/eval/<i>"`, built once (it is small).
- `train` record `i` is drawn on demand from a generator seeded
  `"<task>/<seed>/train/<i>/<attempt>"`, redrawn while its prompt is in `eval`,
  so train and eval prompts are disjoint and any record is available in O(1)
  without building the split: the batch iterator needs only `len` and indexing.

String seeds hash through SHA-512 in `random.Random`, so the splits are the same
in every process, run and Python version 3.2+.
"""
import random
from typing import Callable, NamedTuple, Sequence

_MAX_REDRAWS = 1000  # attempts at a train problem outside eval before giving up


def exact_and_format_rewards(name: str) -> dict:
  """The built-in tasks' rewards: `jaxrl_llm.rewards.NAME`'s `NAME_exact` (weight 1, the
  held-out accuracy) and `NAME_format` (weight 0.1), as `Task` fields."""
  module = f"jaxrl_llm.rewards.{name}"
  return dict(reward_functions=(f"{module}:{name}_exact", f"{module}:{name}_format"),
              reward_weights=(1.0, 0.1))


class Task(NamedTuple):
  """A built-in task.

  Attributes:
    load_split: `load_split(split, **options) -> Sequence[dict]`, split 'train' or 'eval'.
    demonstration: `demonstration(record, rng, **teacher) -> str`, the target completion
      (SFT); `rng` is a `random.Random` seeded by the split and the record's index (for a
      teacher that errs at random), `teacher` the options named in `teacher_options`.
    reward_functions: the import paths of its rewards, exact match first.
    reward_weights: one weight per reward function.
    teacher_options: the `load_split` options that change only the demonstrations.
  """
  load_split: Callable[..., Sequence[dict]]
  demonstration: Callable[..., str]
  reward_functions: tuple[str, ...]
  reward_weights: tuple[float, ...]
  teacher_options: tuple[str, ...] = ()


def _check_index(i: int, size: int) -> int:
  if not isinstance(i, int):
    raise TypeError(f"Record index must be an int, not {type(i).__name__}.")
  j = i + size if i < 0 else i
  if not 0 <= j < size:
    raise IndexError(f"Record index {i} out of range for {size} records.")
  return j


class GeneratedSplit(Sequence):
  """`size` records, record `i` drawn on demand from its own seeded generator."""

  def __init__(self, make: Callable[[random.Random], dict], *, key: str, size: int,
               exclude: frozenset = frozenset()):
    if size < 1:
      raise ValueError(f"{key}: a split needs at least 1 record, got size={size}.")
    self._make, self._key, self._size, self._exclude = make, key, size, exclude

  def __len__(self) -> int:
    return self._size

  def __getitem__(self, i: int) -> dict:
    i = _check_index(i, self._size)
    for attempt in range(_MAX_REDRAWS):
      record = self._make(random.Random(f"{self._key}/{i}/{attempt}"))
      if record["prompt"] not in self._exclude:
        return record
    raise RuntimeError(f"{self._key}: record {i} collided with the eval split "
                       f"{_MAX_REDRAWS} times; the problem space is too small.")


def distinct_records(make: Callable[[random.Random], dict], *, key: str,
                     size: int) -> list[dict]:
  """The first `size` records with distinct prompts from generators `key/0, key/1, ...`."""
  records, seen = [], set()
  for i in range(max(100, 50 * size)):
    record = make(random.Random(f"{key}/{i}"))
    if record["prompt"] not in seen:
      seen.add(record["prompt"])
      records.append(record)
      if len(records) == size:
        return records
  raise ValueError(f"{key}: found only {len(records)} distinct problems, {size} wanted; "
                   "raise the difficulty or lower num_eval.")


def make_split(make: Callable[[random.Random], dict], *, task: str, split: str,
               seed: int, num_train: int, num_eval: int) -> Sequence[dict]:
  """The `split` ('train' or 'eval') of a generated task; see the module docstring."""
  eval_records = distinct_records(make, key=f"{task}/{seed}/eval", size=num_eval)
  if split == "eval":
    return eval_records
  if split == "train":
    return GeneratedSplit(make, key=f"{task}/{seed}/train", size=num_train,
                          exclude=frozenset(r["prompt"] for r in eval_records))
  raise ValueError(f"Task {task!r} has splits 'train' and 'eval', not {split!r}.")


class Demonstrations(Sequence):
  """A split's records, each with its target `completion` added (for SFT).

  Record `i`'s completion is `demonstration(record, random.Random(f"{key}/{i}"))`, so a
  random teacher is deterministic too, and independent from one record to the next.
  """

  def __init__(self, records: Sequence[dict],
               demonstration: Callable[[dict, random.Random], str], *, key: str):
    self._records, self._demonstration, self._key = records, demonstration, key

  def __len__(self) -> int:
    return len(self._records)

  def __getitem__(self, i: int) -> dict:
    record = self._records[i]
    i = _check_index(i, len(self._records))
    rng = random.Random(f"{self._key}/{i}")
    return {**record, "completion": self._demonstration(record, rng)}
