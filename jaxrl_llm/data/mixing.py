"""Prompt batches drawn from several sources at once, deterministic and exactly resumable.

Each source (`config.sources.NAME`) is its own endless record stream (`batching`:
epoch `e` visits every record once in the order drawn from `(seed, e)`), and its
position is the number of items taken from it. Every global batch of P prompts takes
`mix_counts(weights, P)` items from the sources in order, so that a batch is
`[n_0 items of source 0, n_1 of source 1, ...]`, and advances each source's position by
its count. Batch `k` depends only on the positions it starts from, which a checkpoint
stores: a run resumed from them continues exactly as an uninterrupted one.

With several processes each takes its contiguous slice of every global batch, as
`batching.prompt_batches` does, and reads only those records.
"""
from __future__ import annotations

import math
from typing import Iterator, Mapping, Sequence

import numpy as np

from jaxrl_llm.data import batching


def mix_counts(weights: Sequence[float], total: int) -> list[int]:
  """`total` prompts split by `weights`: largest remainders, ties to the earlier source.

  Every batch takes the same counts, so each source's share of the run is its weight's
  share to within one prompt per batch.
  """
  weights = [float(w) for w in weights]
  norm = sum(weights)
  if not norm > 0:
    raise ValueError(f"source weights {weights}: expected at least one > 0")
  quotas = [w / norm * total for w in weights]
  counts = [math.floor(q) for q in quotas]
  order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
  for i in order[:total - sum(counts)]:
    counts[i] += 1
  return counts


def mixed_batches(datasets: Mapping[str, Sequence[dict]], weights: Mapping[str, float],
                  batch_size: int, *, seed: int, start: int = 0,
                  positions: Mapping[str, int] | None = None, process_index: int = 0,
                  process_count: int = 1) -> Iterator[batching.RecordBatch]:
  """Endless mixed batches; see the module docstring.

  Args:
    datasets: source name -> records (random access), in the run's source order.
    weights: source name -> its share of every batch (normalised; 0 takes nothing).
    batch_size: P, the global batch size, a multiple of `process_count`.
    seed: the shuffle seed; source i's stream is shuffled by `(seed, i)`, so two sources
      of the same data do not take the same records in the same order.
    start: the number of the first batch (the checkpoint's `data_position`).
    positions: items already taken from each source (a checkpoint's `source_positions`;
      a source it lacks starts at 0).
    process_index, process_count: this process's slice of each batch.

  Yields:
    `RecordBatch`es with `sources` (each record's source index) and `source_positions`
    (every source's position after the batch).
  """
  local = batching.process_share(batch_size, process_index, process_count)
  names = list(datasets)
  counts = mix_counts([weights[n] for n in names], batch_size)
  positions = {n: int((positions or {}).get(n, 0)) for n in names}
  # Row j of a global batch: its source and its offset among that source's rows.
  source_of_row = np.repeat(np.arange(len(names)), counts)
  offset_of_row = np.concatenate([np.arange(c) for c in counts]).astype(np.int64)
  mine = slice(process_index * local, (process_index + 1) * local)
  number = start
  while True:
    sources, offsets = source_of_row[mine], offset_of_row[mine]
    indices = np.empty(local, np.int64)
    records = [None] * local
    for i, name in enumerate(names):
      here = sources == i
      if here.any():
        stream = positions[name] + offsets[here]
        indices[here] = batching.stream_indices(len(datasets[name]), stream, seed=(seed, i))
        for row, index in zip(np.flatnonzero(here), indices[here]):
          records[row] = datasets[name][int(index)]
    positions = {n: positions[n] + c for n, c in zip(names, counts)}
    yield batching.RecordBatch(position=number, indices=indices, records=records,
                               valid=np.ones(local, bool), sources=sources.astype(np.int32),
                               source_positions=dict(positions))
    number += 1
