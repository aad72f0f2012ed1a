"""`tfds:NAME[/CONFIG][:SPLIT]` datasets, read from a local TFDS data directory.

Nothing downloads at run time: the dataset must already be prepared under
`config.data.tfds_data_dir` (in `array_record` format, which needs no
TensorFlow), e.g. by `builder(data_dir=..., file_format="array_record")
.download_and_prepare()` on a machine that may download. It is read with
`tfds.data_source`, which gives random access, so a run resumes at an exact
record. Records come back as plain Python: bytes decoded to str (UTF-8), numpy
scalars to Python numbers, arrays and sequences to lists.
"""
import os
from typing import Any, Sequence

import numpy as np


def _to_python(value: Any) -> Any:
  """Bytes -> str, numpy scalars -> numbers, arrays/lists -> lists, dicts recursively."""
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, dict):
    return {k: _to_python(v) for k, v in value.items()}
  if isinstance(value, np.ndarray):
    if value.ndim == 0:
      return _to_python(value.item())
    return [_to_python(v) for v in value]
  if isinstance(value, (list, tuple)):
    return [_to_python(v) for v in value]
  if isinstance(value, np.generic):
    return _to_python(value.item())
  return value


class TfdsDataset(Sequence):
  """A prepared TFDS split as a sequence of plain-Python records."""

  def __init__(self, name: str, split: str, data_dir: str):
    """Opens the split.

    Args:
      name: `NAME` or `NAME/CONFIG`.
      split: a TFDS split spec ('train', 'test', 'train[:90%]', ...); 'eval'
        reads 'test', else 'validation', when the dataset has no 'eval' split.
      data_dir: the local TFDS data directory (config.data.tfds_data_dir).

    Raises:
      ValueError: no data_dir, a dataset not prepared there, an unknown split, or
        records without a `prompt` feature.
    """
    if not data_dir:
      raise ValueError(f"tfds:{name} needs config.data.tfds_data_dir: the local "
                       "directory holding the prepared dataset (nothing downloads).")
    base_name = name.split("/")[0]
    if not os.path.isdir(os.path.join(data_dir, base_name)):
      raise ValueError(f"TFDS dataset {name!r} is not prepared under {data_dir!r} "
                       f"(no {os.path.join(data_dir, base_name)!r}); prepare it first "
                       "with builder(data_dir=..., file_format='array_record')"
                       ".download_and_prepare().")
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    builder = tfds.builder(name, data_dir=data_dir)
    if "prompt" not in builder.info.features:
      raise ValueError(f"TFDS dataset {name!r} has no 'prompt' feature "
                       f"(features: {sorted(builder.info.features)}).")
    splits = list(builder.info.splits)
    if split == "eval" and "eval" not in splits:
      split = next((s for s in ("test", "validation") if s in splits), split)
    try:
      self._source = tfds.data_source(name, data_dir=data_dir, split=split)
    except ValueError as e:
      raise ValueError(f"TFDS dataset {name!r}: cannot read split {split!r} "
                       f"(splits: {splits}): {e}") from e
    self.name, self.split = name, split

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, i: int) -> dict:
    if not isinstance(i, (int, np.integer)):
      raise TypeError(f"Record index must be an int, not {type(i).__name__}.")
    size = len(self._source)
    j = int(i) + size if i < 0 else int(i)
    if not 0 <= j < size:
      raise IndexError(f"Record index {i} out of range for {size} records.")
    return _to_python(self._source[j])
