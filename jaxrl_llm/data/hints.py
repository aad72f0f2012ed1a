"""Hinted prompts for on-policy self-distillation (prime-rl's `opsd`).

The teacher of a self-distilling source is the policy itself, reading each prompt after
a hint: a system message made from `algo.distill.hint_template` with the record's
`hint_field` (an expert demonstration) in place of `{demonstration}`. Its tokens are
the tokenizer's chat template rendering that one message (no generation prompt), or
the plain text where the tokenizer has no template, as prime-rl renders its hint block;
they go before the prompt's own tokens, unchanged, so the completion that follows is
the one the policy sampled, token for token, and the hint is sliced off by position
(the trainer scores the completion tokens only).

Every hinted prompt is left-padded to the prompt bucket plus `max_hint_len`: one shape
for every batch, so the scoring program compiles once.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Hint:
  """One source's hint: the record field and the template (`algo.distill`)."""
  field: str
  template: str


def render_hint(tokenizer, template: str, demonstration: str) -> list[int]:
  """The hint block's ids: a system message through the chat template, or the text."""
  text = template.format(demonstration=demonstration)
  if getattr(tokenizer, "chat_template", None):  # rendered, then encoded as prompts are
    text = tokenizer.apply_chat_template([{"role": "system", "content": text}], tokenize=False,
                                         add_generation_prompt=False)
  return list(tokenizer.encode(text, add_special_tokens=False))


def hinted_prompts(tokenizer, records: Sequence[dict], token_lists: Sequence[Sequence[int]],
                   hints: Sequence[Hint | None], width: int, max_hint_len: int, pad_id: int,
                   indices: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Each prompt after its hint (or alone, where `hints[i]` is None), left-padded.

  Args:
    tokenizer: the policy's tokenizer.
    records: the batch's records (the hint field is read from each).
    token_lists: each prompt's ids, as the sampler read them.
    hints: per record, its source's `Hint`, or None for a source without one.
    width: the prompts' padded length (their bucket); the result is `width + max_hint_len`.
    max_hint_len: the most tokens a hint block may take (`algo.distill.max_hint_len`).
    pad_id: the padding id.
    indices: the records' dataset indices, for errors.

  Returns:
    tokens, mask: int32 [b, width + max_hint_len].

  Raises:
    ValueError: a record without the hint field, or a hint longer than `max_hint_len`
      (naming the record, the field and the limit).
  """
  size = width + max_hint_len
  tokens = np.full((len(records), size), pad_id, np.int32)
  mask = np.zeros((len(records), size), np.int32)
  for row, (record, ids, hint) in enumerate(zip(records, token_lists, hints)):
    where = f"record {int(indices[row]) if indices is not None else row}"
    block: list[int] = []
    if hint is not None:
      value = record.get(hint.field)
      if value is None or isinstance(value, (dict, list)):
        raise ValueError(f"{where} has no text in field {hint.field!r} "
                         f"(algo.distill.hint_field), which self-distillation puts in its "
                         f"hint (fields: {sorted(record)})")
      block = render_hint(tokenizer, hint.template, str(value))
      if len(block) > max_hint_len:
        raise ValueError(f"{where}: its hint is {len(block)} tokens, more than "
                         f"algo.distill.max_hint_len={max_hint_len}: expected a shorter "
                         f"{hint.field!r} or a larger max_hint_len")
    full = block + list(ids)
    tokens[row, size - len(full):] = full
    mask[row, size - len(full):] = 1
  return tokens, mask
