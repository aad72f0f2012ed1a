"""Rewards of a batch's rows, each row by its own source's reward functions."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxrl_llm import data
from jaxrl_llm.config import reward_checks
from jaxrl_llm.rewards import Rewards


class RowScorer:
  """Scores the G rows of each prompt of a batch by its source's `RewardSet`.

  Args:
    sources: the run's sources (`Plan.sources`), in order; each has its `rewards`.
    mixed: a mixed run (`config.sources`): its batches carry each record's source, and its
      functions are named `SOURCE/FUNCTION` (NaN on the other sources' rows).
    num_samples: G, the rows of each prompt.
    judge: `config.judge`'s model (`rewards.judge.Judge`), for the sources it scores.
  """

  def __init__(self, sources: Sequence, mixed: bool, num_samples: int, judge=None):
    self.reward_sets = [reward_checks.reward_set(s, judge) for s in sources]
    self.judge = judge
    self.names = tuple(s.name for s in sources) if mixed else ()
    self.G = num_samples
    self.judge_flops = 0.0  # `config.judge`'s model FLOPs on the rows scored (`take_judge_flops`)

  def take_judge_flops(self) -> float:
    """The judge's FLOPs since the last call (0 without a judge)."""
    spent, self.judge_flops = self.judge_flops, 0.0
    return spent

  def __call__(self, batch: data.RecordBatch, prompts: list[str], completions: list[str],
               extra: dict[str, list] | None = None) -> Rewards:
    """The rewards of `completions` (G per record of `batch`, prompt-major); `extra`: more
    fields, one value per row (an episode's `turns` and `messages`)."""
    before = self._judge_flops()
    try:
      return self._score(batch, prompts, completions, extra or {})
    finally:
      self.judge_flops += self._judge_flops() - before

  def _judge_flops(self) -> float:
    return 0.0 if self.judge is None else self.judge.flops

  def _score(self, batch: data.RecordBatch, prompts: list[str], completions: list[str],
             extra: dict[str, list]) -> Rewards:
    G = self.G
    if batch.sources is None:
      return self.reward_sets[0](prompts, completions, **batch.fields(repeat=G), **extra)
    total = np.zeros(len(prompts), np.float32)
    per_function = {f"{name}/{fn}": np.full(len(prompts), np.nan, np.float32)
                    for name, rs in zip(self.names, self.reward_sets) for fn in rs.names}
    rows_source = np.repeat(batch.sources, G)
    for i, (name, reward_set) in enumerate(zip(self.names, self.reward_sets)):
      rows = np.flatnonzero(rows_source == i)
      if rows.size:
        scored = reward_set([prompts[r] for r in rows], [completions[r] for r in rows],
                            **batch.subset(batch.sources == i).fields(repeat=G),
                            **{k: [v[r] for r in rows] for k, v in extra.items()})
        total[rows] = scored.total
        for fn, values in scored.per_function.items():
          per_function[f"{name}/{fn}"][rows] = values
    return Rewards(total, per_function)
