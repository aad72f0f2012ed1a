"""Deterministic, resumable prompt batches, sliced per process.

The records are read as one endless stream: epoch `e` visits every record once,
in the order of a permutation drawn from `(seed, e)` (or in dataset order with
`epoch_shuffle=False`), and global batch `k` is stream items
`[k * batch_size, (k + 1) * batch_size)`, running on into the next epoch where
one ends. So batch `k` depends only on `(seed, k)` and the dataset: `k` is the
*position* a checkpoint stores, and an iterator started at `k` yields exactly
what an uninterrupted run yields from batch `k` on.

With several processes (hosts), each takes its own contiguous slice of every
global batch, `[p * batch_size / P, (p + 1) * batch_size / P)`, and reads only
those records.
"""
import dataclasses
import functools
from typing import Iterator, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class RecordBatch:
  """This process's share of one global batch.

  Attributes:
    position: the global batch number; a run resumed at `position + 1` continues
      after this batch.
    indices: int64 [b], the dataset indices of `records`.
    records: the b records (b = batch_size / process_count).
    valid: bool [b]; False marks padding (only in `sequential_batches`).
    sources: int32 [b], each record's source in a mixed run (`data.mixing`), else None.
    source_positions: a mixed run's items taken from each source after this batch
      (what a checkpoint stores), else None.
  """
  position: int
  indices: np.ndarray
  records: list[dict]
  valid: np.ndarray
  sources: np.ndarray | None = None
  source_positions: dict[str, int] | None = None

  def subset(self, keep: np.ndarray) -> "RecordBatch":
    """The records where `keep` (bool [b]) is True, as a batch of their own."""
    rows = np.flatnonzero(keep)
    pick = lambda a: None if a is None else a[rows]
    return dataclasses.replace(self, indices=self.indices[rows],
                               records=[self.records[i] for i in rows], valid=self.valid[rows],
                               sources=pick(self.sources))

  @property
  def prompts(self) -> list[str]:
    return [r["prompt"] for r in self.records]

  def fields(self, repeat: int = 1) -> dict[str, list]:
    """The columns other than `prompt` (None where a record lacks one).

    Args:
      repeat: G, the samples per prompt: each value repeats G times in a row,
        aligning with completions in prompt-major order ([P, G] flattened).

    Returns:
      {field: list of b * repeat values}, the reward functions' keyword arguments.
    """
    keys = dict.fromkeys(k for r in self.records for k in r if k != "prompt")
    return {k: [r.get(k) for r in self.records for _ in range(repeat)] for k in keys}


@functools.lru_cache(maxsize=4)
def _permutation(num_records: int, seed: int | tuple[int, ...], epoch: int) -> np.ndarray:
  entropy = [*seed, epoch] if isinstance(seed, tuple) else [seed, epoch]
  rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
  return rng.permutation(num_records)


def process_share(batch_size: int, process_index: int, process_count: int) -> int:
  """Validates the split of a global batch; returns the per-process size."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count}).")
  if batch_size % process_count:
    raise ValueError(f"Global batch size {batch_size} does not split evenly over "
                     f"{process_count} processes.")
  return batch_size // process_count


def batch_indices(num_records: int, batch_size: int, position: int, *, seed: int,
                  epoch_shuffle: bool = True, process_index: int = 0,
                  process_count: int = 1) -> np.ndarray:
  """Dataset indices of this process's slice of global batch `position`.

  Args:
    num_records: the dataset's size.
    batch_size: the global batch size (all processes together).
    position: the global batch number, >= 0.
    seed: the shuffle seed (config.data.shuffle_seed).
    epoch_shuffle: a new permutation per epoch; False keeps dataset order.
    process_index, process_count: this process and how many there are.

  Returns:
    int64 [batch_size / process_count].
  """
  local = process_share(batch_size, process_index, process_count)
  if num_records < 1:
    raise ValueError("Cannot batch an empty dataset.")
  if position < 0:
    raise ValueError(f"position must be >= 0, got {position}.")
  start = position * batch_size + process_index * local
  return stream_indices(num_records, np.arange(start, start + local, dtype=np.int64), seed=seed,
                        epoch_shuffle=epoch_shuffle)


def stream_indices(num_records: int, stream: np.ndarray, *, seed: int | tuple[int, ...],
                   epoch_shuffle: bool = True) -> np.ndarray:
  """Dataset indices of the items `stream` (int64) of the endless record stream: item `i`
  is record `permutation(seed, i // num_records)[i % num_records]`."""
  epochs, offsets = np.divmod(stream, num_records)
  if not epoch_shuffle:
    return offsets
  out = np.empty_like(offsets)
  for epoch in np.unique(epochs):
    here = epochs == epoch
    out[here] = _permutation(num_records, seed, int(epoch))[offsets[here]]
  return out


def prompt_batches(dataset: Sequence[dict], batch_size: int, *, seed: int,
                   epoch_shuffle: bool = True, start: int = 0, process_index: int = 0,
                   process_count: int = 1) -> Iterator[RecordBatch]:
  """Endless batches from global batch `start` on; see the module docstring.

  Args:
    dataset: records with random access (`len`, indexing).
    batch_size: the global batch size, a multiple of `process_count`.
    seed: the shuffle seed (config.data.shuffle_seed).
    epoch_shuffle: reshuffle every epoch; False keeps dataset order.
    start: the first global batch (a checkpoint's stored position).
    process_index, process_count: this process's slice of each batch.

  Yields:
    `RecordBatch`es with positions start, start + 1, ...
  """
  process_share(batch_size, process_index, process_count)
  position = start
  while True:
    indices = batch_indices(len(dataset), batch_size, position, seed=seed,
                            epoch_shuffle=epoch_shuffle, process_index=process_index,
                            process_count=process_count)
    yield RecordBatch(position=position, indices=indices,
                      records=[dataset[int(i)] for i in indices],
                      valid=np.ones(indices.shape, bool))
    position += 1


def sequential_batches(dataset: Sequence[dict], batch_size: int, *, process_index: int = 0,
                       process_count: int = 1) -> Iterator[RecordBatch]:
  """One ordered pass (evaluation), every batch full size: the last one is padded.

  Padding repeats record 0 and is marked `valid=False`, so every process sees
  the same shapes and the same number of batches.
  """
  local = process_share(batch_size, process_index, process_count)
  for position in range(-(-len(dataset) // batch_size)):
    start = position * batch_size + process_index * local
    stream = np.arange(start, start + local, dtype=np.int64)
    valid = stream < len(dataset)
    indices = np.where(valid, stream, 0)
    yield RecordBatch(position=position, indices=indices,
                      records=[dataset[int(i)] for i in indices], valid=valid)
