"""Single-turn RL rollouts: G completions per prompt sampled by the policy, scored, and
with DAPO's dynamic sampling the informative groups kept."""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import jax
import numpy as np

from jaxrl_llm import data, distributed, objectives, sampling
from jaxrl_llm.rewards import Rewards
from jaxrl_llm.training.plan import Plan
from jaxrl_llm.training.rollouts import summary
from jaxrl_llm.training.rollouts.contract import (Hinted, Mixed, RewardStats, Rollout,
                                                  RolloutStats, decode_completions,
                                                  prompt_aligned_routing)
from jaxrl_llm.training.rollouts.scoring import RowScorer


@dataclasses.dataclass
class Block:
  """One round of sampling: its prompts and the sampler's output; once scored
  (`SampledRollouts.score`), its texts, rewards, informative groups and hinted prompts."""
  batch: data.RecordBatch
  prompts: data.TokenizedPrompts
  out: sampling.SampleOutput
  texts: list[str] | None = None  # each row's prompt
  completions: list[str] | None = None
  scored: Rewards | None = None
  informative: np.ndarray | None = None  # bool [P]
  hinted: tuple[np.ndarray, np.ndarray] | None = None


@dataclasses.dataclass
class Pending:
  """A rollout whose sampling is issued (`SampledRollouts.start`): its rounds so far and
  the seconds spent scoring them."""
  blocks: list[Block] = dataclasses.field(default_factory=list)
  reward_time: float = 0.0


class SampledRollouts:
  """RL rollouts: sample G completions per prompt, score them, keep informative groups.

  Args:
    plan: the run's plan (its algorithm, sources and whether rows are mixed or hinted).
    settings: the sampler's settings (G: `num_samples`).
    prompt_format: how prompts are tokenised (`data.PromptFormat`).
    tokenizer: the policy's tokenizer.
    batches: this process's prompt batches.
    sampler: the sampler (`sampling.Sampler`).
    judge: `config.judge`'s model, for the sources it scores (None without one).
  """

  def __init__(self, plan: Plan, settings: sampling.SamplingSettings,
               prompt_format: data.PromptFormat, tokenizer,
               batches: Iterator[data.RecordBatch], sampler: sampling.Sampler, judge=None):
    self.algo, self.format, self.tokenizer = plan.algo, prompt_format, tokenizer
    self.batches, self.sampler = batches, sampler
    self.G, self.pad = settings.num_samples, settings.pad_id
    self.score_rows = RowScorer(plan.sources, plan.mixed, self.G, judge)
    self.hints = ([data.Hint(s.algo.distill.hint_field, s.algo.distill.hint_template)
                   if s.algo.distill.teacher == "self" else None for s in plan.sources]
                  if plan.self_teacher else [])

  def start(self, policy, key: jax.Array) -> Pending:
    """Issues the rollout's sampling (see `RolloutSource`): every round of dynamic sampling,
    each process sampling until all have P informative groups."""
    dynamic = self.algo.dynamic_sampling
    rounds = dynamic.max_rounds if dynamic.enabled else 1
    pending = Pending()
    for r in range(rounds):
      batch = next(self.batches)
      prompts = self.format.tokenize(self.tokenizer, batch.prompts, indices=batch.indices)
      out = self.sampler(policy, prompts.token_lists, jax.random.fold_in(key, r))
      pending.blocks.append(Block(batch, prompts, out))
      if not dynamic.enabled:
        break
      if distributed.all_true(self._score_all(pending) >= len(batch.records)):
        break
    return pending

  def finish(self, pending: Pending) -> Rollout:
    """The rollout: this process's rows of the last round read and scored, the batch
    assembled (no collective)."""
    self._score_all(pending)
    rollout = self._assemble(pending.blocks)
    rollout.metrics["reward_time_s"] = pending.reward_time
    return rollout

  def summarize(self, rollout: Rollout) -> dict[str, float]:
    return summary.summarize(rollout.stats, self.score_rows.names, self.algo)

  def close(self) -> None:
    pass

  def _score_all(self, pending: Pending) -> int:
    """Scores the blocks not yet scored; returns the informative groups so far."""
    for block in pending.blocks:
      if block.scored is None:
        pending.reward_time += self._score(block)
    return sum(int(b.informative.sum()) for b in pending.blocks)

  def _score(self, block: Block) -> float:
    """Reads a block's rows here, decodes and scores them; returns the seconds scoring took."""
    batch, G = block.batch, self.G
    block.out = distributed.local_rows(block.out)
    block.texts = [p for p in batch.prompts for _ in range(G)]
    t0 = time.perf_counter()
    block.completions = decode_completions(self.tokenizer, block.out.tokens, block.out.lengths)
    block.scored = self.score_rows(batch, block.texts, block.completions)
    seconds = time.perf_counter() - t0
    P = len(batch.records)
    block.informative = np.asarray(objectives.dynamic_sampling_keep(
        block.scored.total.reshape(P, G)))
    block.hinted = self._hinted(batch, block.prompts)
    return seconds

  def _hinted(self, batch: data.RecordBatch, prompts: data.TokenizedPrompts):
    """(tokens, mask) of every prompt after its source's hint, or None without hints."""
    if not self.hints:
      return None
    sources = batch.sources if batch.sources is not None else np.zeros(len(batch.records), int)
    return data.hinted_prompts(self.tokenizer, batch.records, prompts.token_lists,
                               [self.hints[s] for s in sources], prompts.tokens.shape[1],
                               self.algo.distill.max_hint_len, self.pad, indices=batch.indices)

  def _assemble(self, blocks: list[Block]) -> Rollout:
    """The first P groups, informative ones first when dynamic sampling is on."""
    G, algo = self.G, self.algo
    P = len(blocks[0].prompts.token_lists)
    chosen = [(b, p) for b, blk in enumerate(blocks) for p in range(P)]
    if algo.dynamic_sampling.enabled:
      chosen.sort(key=lambda bp: not blocks[bp[0]].informative[bp[1]])  # stable
    chosen = chosen[:P]
    rows = lambda b, p: slice(p * G, (p + 1) * G)
    take = lambda f: np.concatenate([f(blocks[b])[rows(b, p)] for b, p in chosen])
    prompt_tokens, prompt_mask = _repad([blocks[b].prompts.tokens[p:p + 1] for b, p in chosen],
                                        [blocks[b].prompts.mask[p:p + 1] for b, p in chosen],
                                        self.pad)
    total = take(lambda blk: blk.scored.total)
    lengths, truncated = take(lambda blk: blk.out.lengths), take(lambda blk: blk.out.truncated)
    shaped = np.asarray(objectives.overlong_shaped_rewards(total, lengths, algo.overlong))
    group_valid = np.array([bool(blocks[b].informative[p]) or not algo.dynamic_sampling.enabled
                            for b, p in chosen])
    last = blocks[-1].batch
    mixed = None if last.sources is None else Mixed(
        np.array([blocks[b].batch.sources[p] for b, p in chosen], np.int32),
        last.source_positions)
    rewards = RewardStats(
        per_function={name: take(lambda blk, n=name: blk.scored.per_function[n])
                      for name in blocks[0].scored.per_function},
        total=total, shaped=shaped, group_valid=group_valid,
        informative=np.concatenate([b.informative for b in blocks]),
        sources=np.repeat(np.zeros(len(chosen), np.int32) if mixed is None else mixed.sources,
                          G), rounds=np.asarray([len(blocks)]))
    stats = RolloutStats(lengths=lengths, truncated=truncated, rewards=rewards,
                         truncated_prompts=np.asarray([sum(b.prompts.num_truncated
                                                           for b in blocks)]))
    return Rollout(
        prompt_tokens=prompt_tokens, prompt_mask=prompt_mask,
        tokens=take(lambda blk: blk.out.tokens), mask=take(lambda blk: blk.out.mask),
        logprobs=take(lambda blk: blk.out.logprobs), lengths=lengths, truncated=truncated,
        rewards=shaped.astype(np.float32), group_valid=group_valid, position=last.position + 1,
        prompts=[blocks[b].texts[p * G] for b, p in chosen],
        completions=[c for b, p in chosen for c in blocks[b].completions[rows(b, p)]],
        stats=stats, mixed=mixed, hinted=self._chosen_hints(blocks, chosen),
        routing=self._chosen_routing(blocks, chosen, prompt_tokens.shape[1]),
        judge_flops=self.score_rows.take_judge_flops())

  def _chosen_hints(self, blocks: list[Block], chosen) -> Hinted | None:
    if blocks[0].hinted is None:
      return None
    return Hinted(*_repad([blocks[b].hinted[0][p:p + 1] for b, p in chosen],
                          [blocks[b].hinted[1][p:p + 1] for b, p in chosen], self.pad))

  def _chosen_routing(self, blocks: list[Block], chosen, prompt_len: int) -> np.ndarray | None:
    """The chosen rows' recorded experts, aligned with the repadded prompts."""
    if blocks[0].out.routing is None:
      return None
    N, G = blocks[0].out.tokens.shape[1], self.G
    aligned = [prompt_aligned_routing(blk.out.routing, prompt_len, N) for blk in blocks]
    return np.concatenate([aligned[b][p * G:(p + 1) * G] for b, p in chosen])


def _repad(arrays: list[np.ndarray], masks: list[np.ndarray], pad: int):
  """Left-pads prompt blocks of different bucket lengths to the longest."""
  S0 = max(a.shape[1] for a in arrays)
  out_t, out_m = [], []
  for a, mask in zip(arrays, masks):
    extra = S0 - a.shape[1]
    out_t.append(np.pad(a, ((0, 0), (extra, 0)), constant_values=pad))
    out_m.append(np.pad(mask, ((0, 0), (extra, 0))))
  return np.concatenate(out_t), np.concatenate(out_m)
