"""`jsonl:PATH` datasets: one JSON object per line, each with a `prompt`.

  {"prompt": "Natalia sold clips to 48 friends ...", "answer": "... #### 72"}

The whole file is read and checked when it is loaded, so a bad line stops the
run before training starts, with its line number. Blank lines are skipped; any
other field of an object (`answer`, `numbers`, ...) is passed to the reward
functions under its own name.
"""
import json

from jaxrl_llm import paths


def read_jsonl(path: str) -> list[dict]:
  """Reads and checks a JSONL prompt file.

  Args:
    path: the file, local or gs://.

  Returns:
    One dict per non-blank line, each with a string `prompt`.

  Raises:
    FileNotFoundError: no such file.
    ValueError: a line that is not a JSON object, lacks a string `prompt`, or a
      file with no records.
  """
  if not paths.isfile(path):
    raise FileNotFoundError(f"JSONL data file {path!r} does not exist.")
  records = []
  with paths.open(path) as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{line_number}: not valid JSON ({e.msg}): "
                         f"{line.strip()[:120]!r}") from e
      if not isinstance(record, dict):
        raise ValueError(f"{path}:{line_number}: expected a JSON object with a 'prompt' "
                         f"field, got a {type(record).__name__}.")
      if "prompt" not in record:
        raise ValueError(f"{path}:{line_number}: the object has no 'prompt' field "
                         f"(fields: {sorted(record)}).")
      if not isinstance(record["prompt"], str):
        raise ValueError(f"{path}:{line_number}: 'prompt' is a "
                         f"{type(record['prompt']).__name__}, not a string.")
      records.append(record)
  if not records:
    raise ValueError(f"JSONL data file {path!r} holds no records: expected one JSON object with "
                     "a 'prompt' field per line.")
  return records
