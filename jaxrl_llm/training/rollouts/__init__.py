"""Rollouts: where each step's batch comes from, as one typed contract.

Every producer is a `RolloutSource` (`start` / `finish` / `summarize` / `close`) and hands
the trainer a `Rollout`: the core arrays every step has (prompts, completions, masks,
rewards), the parts some runs add, each typed and None otherwise (`Mixed` sources,
`Hinted` prompts, `EpisodeParts`, MoE `routing`), and its `RolloutStats`, which
`summarize` turns into the step's metrics. The producers take the run's `Plan`, its
`SamplingSettings` and `PromptFormat`, never the config:

  sampled     `SampledRollouts`: G completions per prompt, scored, DAPO's dynamic sampling;
  partial     `PartialRollouts`: the same, from generations that span weight publishes;
  partial_episodes  `PartialEpisodeRollouts`: episodes whose turns span them;
  multi_turn  `EpisodeRollouts`: G episodes per prompt against each source's environment
              (`episodes` plays them), and `ConversationRollouts`: demonstrated ones (SFT);
  dataset     `DatasetRollouts`: each record's target completion (SFT).

`prepare.batch_arrays` turns a `Rollout` into the training batch, a `TrainBatch` whose
optional fields the plan fills.
"""
from __future__ import annotations

from typing import Iterator

from jaxrl_llm import data, sampling
from jaxrl_llm.training.plan import Plan
from jaxrl_llm.training.rollouts.contract import (EpisodeParts, EpisodeStats, Hinted, Mixed,
                                                  RewardStats, Rollout, RolloutSource,
                                                  RolloutStats, decode_completions,
                                                  prompt_aligned_routing)
from jaxrl_llm.training.rollouts.dataset import DatasetRollouts
from jaxrl_llm.training.rollouts.multi_turn import ConversationRollouts, EpisodeRollouts
from jaxrl_llm.training.rollouts.partial import PartialRollouts
from jaxrl_llm.training.rollouts.partial_episodes import PartialEpisodeRollouts
from jaxrl_llm.training.rollouts.sampled import SampledRollouts
from jaxrl_llm.training.rollouts.train_batch import TrainBatch


def for_plan(plan: Plan, settings: sampling.SamplingSettings, prompt_format: data.PromptFormat,
             tokenizer, batches: Iterator[data.RecordBatch], judge=None) -> RolloutSource:
  """The rollout source the plan names: sampled by the policy (episodes where a source has
  an environment) or the dataset's completions (conversations where it has one). `judge`:
  `config.judge`'s model, which scores the sampled rows of the sources it judges."""
  multi_turn = any(s.multi_turn for s in plan.sources)
  if plan.completions == "sample" and multi_turn and plan.partial:
    return PartialEpisodeRollouts(plan, settings, prompt_format, tokenizer, batches, judge)
  if plan.completions == "sample" and multi_turn:
    return EpisodeRollouts(plan, settings, prompt_format, tokenizer, batches, judge)
  if plan.completions == "sample" and plan.partial:
    return PartialRollouts(plan, settings, prompt_format, tokenizer, batches, judge)
  if plan.completions == "sample":
    return SampledRollouts(plan, settings, prompt_format, tokenizer, batches,
                           sampling.Sampler(settings, prompt_format.buckets), judge)
  if plan.sources[0].multi_turn:  # SFT on conversations: the model's turns are the targets
    return ConversationRollouts(plan.sources[0], settings, prompt_format, tokenizer, batches)
  return DatasetRollouts(settings, prompt_format, tokenizer, batches)


__all__ = ["ConversationRollouts", "DatasetRollouts", "EpisodeParts", "EpisodeRollouts",
           "EpisodeStats", "Hinted", "Mixed", "PartialEpisodeRollouts", "PartialRollouts", "RewardStats", "Rollout", "RolloutSource",
           "RolloutStats", "SampledRollouts", "TrainBatch", "decode_completions", "for_plan",
           "prompt_aligned_routing"]
