"""SFT's rollouts: each record's target completion (`config.data.completions='dataset'`)."""
from __future__ import annotations

from typing import Iterator

import jax
import numpy as np

from jaxrl_llm import data, sampling
from jaxrl_llm.training.rollouts import summary
from jaxrl_llm.training.rollouts.contract import Rollout, RolloutStats


class DatasetRollouts:
  """SFT: the target completion of each record, tokenised and ended with EOS (at most
  `settings.max_new_tokens` tokens; the first of `settings.eos_ids`)."""

  def __init__(self, settings: sampling.SamplingSettings, prompt_format: data.PromptFormat,
               tokenizer, batches: Iterator[data.RecordBatch]):
    self.settings, self.format = settings, prompt_format
    self.tokenizer, self.batches = tokenizer, batches

  def start(self, policy, key: jax.Array) -> Rollout:
    """The rollout (nothing to sample: `finish` returns it)."""
    del policy, key
    batch = next(self.batches)
    N, pad = self.settings.max_new_tokens, self.settings.pad_id
    prompts = self.format.tokenize(self.tokenizer, batch.prompts, indices=batch.indices)
    P = len(batch.records)
    tokens = np.full((P, N), pad, np.int32)
    lengths = np.zeros(P, np.int32)
    truncated = np.zeros(P, bool)
    for i, record in enumerate(batch.records):
      if not isinstance(record.get("completion"), str):
        raise ValueError(f"record {int(batch.indices[i])} has no string 'completion' field, which "
                         "config.data.completions='dataset' needs")
      ids = self.tokenizer.encode(record["completion"], add_special_tokens=False)
      ids = ids + list(self.settings.eos_ids[:1])
      truncated[i] = len(ids) > N
      ids = ids[:N]
      tokens[i, :len(ids)] = ids
      lengths[i] = len(ids)
    mask = (np.arange(N)[None, :] < lengths[:, None]).astype(np.int32)
    return Rollout(
        prompt_tokens=prompts.tokens, prompt_mask=prompts.mask, tokens=tokens, mask=mask,
        logprobs=None, lengths=lengths, truncated=truncated, rewards=np.ones(P, np.float32),
        group_valid=np.ones(P, bool), position=batch.position + 1, prompts=batch.prompts,
        completions=[r["completion"] for r in batch.records],
        stats=RolloutStats(lengths, truncated, np.asarray([prompts.num_truncated])))

  def finish(self, pending: Rollout) -> Rollout:
    return pending

  def summarize(self, rollout: Rollout) -> dict[str, float]:
    return summary.summarize(rollout.stats)

  def close(self) -> None:
    pass
