"""`check_inputs(config)`: the data a run reads, opened and checked before any model loads.

The training split (and the eval split when the run evaluates) is loaded as the trainer
loads it, which reads and checks a JSONL file whole (a missing file, malformed JSON, a
record without a string `prompt`, an empty file; for SFT a `completion`), and the first
`PROMPTS_CHECKED` prompts of each split are tokenized as the trainer will (chat
template, `data.max_prompt_len`, `data.prompt_overflow`). A failure is a `ConfigError`
naming the source, the record and what was expected. The trainer's own loading stays
the final word: a later record that breaks a rule still stops the run when it is met.
"""
from __future__ import annotations

from jaxrl_llm import data
from jaxrl_llm.config.errors import ConfigError

PROMPTS_CHECKED = 256  # per split: enough to meet a template or length problem early


def check_inputs(config) -> None:
  """Raises `ConfigError` for data the run could not train on (see the module docstring)."""
  d = config.data
  splits = ["train"] + (["eval"] if config.train.eval_every > 0 else [])
  try:
    tokenizer = data.run_tokenizer(config.model)
    for split in splits:
      load = (data.load_demonstrations if d.completions == "dataset" and split == "train"
              else data.load_dataset)
      records = load(d, split, task_options=d.task_options)
      first = [records[i] for i in range(min(len(records), PROMPTS_CHECKED))]
      for i, record in enumerate(first):
        if not isinstance(record.get("prompt"), str):
          raise ValueError(f"config.data.source={d.source!r} (split {split!r}): record {i} has "
                           f"no string 'prompt' field (fields: {sorted(record)})")
      data.tokenize_prompts(tokenizer, [r["prompt"] for r in first], d,
                            config.sampling.prompt_buckets, indices=list(range(len(first))))
  except (ValueError, OSError, ImportError) as e:
    raise ConfigError("; ".join(str(e).splitlines())) from e
