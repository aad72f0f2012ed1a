"""`config.data.source` -> a dataset: a sequence of records with random access.

Sources:
  task:NAME                    a built-in generated task (`jaxrl_llm.tasks`);
                               splits 'train' and 'eval', disjoint.
  jsonl:PATH                   a JSONL file (`data/jsonl.py`). If PATH contains
                               `{split}` it is filled in (`data/{split}.jsonl`),
                               otherwise every split reads the same file.
  tfds:NAME[/CONFIG][:SPLIT]   a TFDS dataset prepared under
                               `config.data.tfds_data_dir` (`data/tfds_source.py`);
                               SPLIT, when given, is read for every split.

A record is a dict with `prompt: str` and any other fields (the reward
functions' keyword arguments); for SFT (`load_demonstrations`) also `completion`. A dataset supports `len` and `dataset[i]`, which
is what makes the batch order in `data/batching.py` exactly resumable.
"""
from typing import Mapping, Sequence

from jaxrl_llm import tasks
from jaxrl_llm.data import jsonl
from jaxrl_llm.data import tfds_source

SOURCE_KINDS = ("task", "jsonl", "tfds")


def parse_source(source: str) -> tuple[str, str]:
  """Splits `'kind:argument'`, e.g. `'tfds:gsm8k:train'` -> `('tfds', 'gsm8k:train')`."""
  kind, sep, argument = str(source).partition(":")
  if not sep or kind not in SOURCE_KINDS or not argument:
    raise ValueError(
        f"config.data.source {source!r} must be 'task:NAME', 'jsonl:PATH' or "
        "'tfds:NAME[/CONFIG][:SPLIT]'.")
  return kind, argument


def load_dataset(data_cfg, split: str, *,
                 task_options: Mapping | None = None) -> Sequence[dict]:
  """Loads one split of the dataset `data_cfg.source` names.

  Args:
    data_cfg: `config.data`; reads `source` and `tfds_data_dir`.
    split: 'train' or 'eval' (for tfds any split spec; 'eval' falls back to
      'test' or 'validation' when the dataset has no 'eval').
    task_options: keyword arguments for a `task:` source (difficulty, seed,
      split sizes; see `jaxrl_llm.tasks`). Ignored by the other sources.

  Returns:
    A non-empty sequence of records (`len`, indexing).

  Raises:
    ValueError / FileNotFoundError: a malformed source, missing data, or an empty
      dataset (the message names the source).
  """
  kind, argument = parse_source(data_cfg.source)
  where = f"config.data.source={data_cfg.source!r} (split {split!r})"
  try:
    if kind == "task":
      dataset = tasks.load_split(argument, split, **dict(task_options or {}))
    elif kind == "jsonl":
      dataset = jsonl.read_jsonl(argument.replace("{split}", split))
    else:
      name, _, fixed_split = argument.partition(":")
      dataset = tfds_source.TfdsDataset(name, fixed_split or split, data_cfg.tfds_data_dir)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"{where}: {e}") from e
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from e
  if len(dataset) == 0:
    raise ValueError(f"{where} has no records: expected at least one.")
  return dataset


def load_demonstrations(data_cfg, split: str, *,
                        task_options: Mapping | None = None) -> Sequence[dict]:
  """Like `load_dataset`, for SFT: every record also has a target `completion`.

  A `task:` source adds each problem's demonstration (`tasks.demonstrations`);
  a `jsonl:` or `tfds:` source must carry a string `completion` field itself
  (checked on the first record; the trainer appends EOS after it).
  """
  kind, argument = parse_source(data_cfg.source)
  if kind == "task":
    return tasks.demonstrations(argument, split, **dict(task_options or {}))
  dataset = load_dataset(data_cfg, split)
  first = dataset[0]
  if not isinstance(first.get("completion"), str):
    raise ValueError(f"config.data.source={data_cfg.source!r} has no string 'completion' field, "
                     "which SFT (config.data.completions='dataset') expects in every record "
                     f"(fields: {sorted(first)}).")
  return dataset
