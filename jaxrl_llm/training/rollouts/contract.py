"""What a rollout source hands the trainer: a `Rollout` (with its `RolloutStats`), behind
the `RolloutSource` protocol every producer implements as an equal."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, runtime_checkable

import jax
import numpy as np
from flax import struct


@dataclasses.dataclass
class Mixed:
  """A mixed run's rows (`config.sources`): `sources` int32 [P], each prompt's source; and
  `positions`, the items taken from each source so far (a checkpoint stores them)."""
  sources: np.ndarray
  positions: dict[str, int]


@dataclasses.dataclass
class Hinted:
  """Self-distillation's prompts (`data.hints`): int32 [P, S0 + H] each, every prompt after
  its hint block (a prompt of a source without one, alone)."""
  tokens: np.ndarray
  mask: np.ndarray


@dataclasses.dataclass
class EpisodeParts:
  """What multi-turn episodes add (`rollouts.episodes`).

  Attributes:
    attention: int32 [B, N], the completion region's tokens attended to: the model's and
      the environment's (`Rollout.mask` holds the model's alone).
    rows: each episode's `envs.Episode.as_row()`, for rollouts.jsonl.
    echo_weights: float32 [B, N], echo's weight of each environment token
      (`config.algo.echo`), or None without echo.
    turn_rewards: float32 [B, N], each model turn's step reward on its last token, or None
      (demonstrations).
  """
  attention: np.ndarray
  rows: list[dict]
  echo_weights: np.ndarray | None = None
  turn_rewards: np.ndarray | None = None


@struct.dataclass
class RewardStats:
  """A sampled rollout's rewards, this process's rows: `per_function` {name: float32 [B]}
  (`SOURCE/NAME` in a mixed run, NaN on the other sources' rows), `total` [B] (before
  shaping), `shaped` [B] (what the advantages read), `group_valid` bool [P],
  `informative` bool [groups sampled] (not all G rewards equal), `sources` int32 [B] (0
  in a one-source run) and `rounds` [1] (dynamic sampling's rounds)."""
  per_function: dict
  total: np.ndarray
  shaped: np.ndarray
  group_valid: np.ndarray
  informative: np.ndarray
  sources: np.ndarray
  rounds: np.ndarray


@struct.dataclass
class EpisodeStats:
  """Multi-turn episodes, this process's rows: `turns` [B] (model turns), `model_tokens`
  [B], `ended` int32 [B] (an index into `envs.episode.ENDINGS`), `dropped` bool [B]
  (an environment error ended it) and `tool_stats` {name: [1]} (tool-call counts)."""
  turns: np.ndarray
  model_tokens: np.ndarray
  ended: np.ndarray
  dropped: np.ndarray
  tool_stats: dict


@struct.dataclass
class RolloutStats:
  """This process's rows of what a rollout's metrics describe; the source's `summarize`
  gathers every process's (one collective) into the metrics (`rollouts.summary`).

  `lengths` int32 [B], `truncated` bool [B] (no EOS within the limit), `truncated_prompts`
  [1] (prompts cut to `max_prompt_len`); `rewards` for sampled rollouts and `episodes` for
  multi-turn ones, else None.
  """
  lengths: np.ndarray
  truncated: np.ndarray
  truncated_prompts: np.ndarray
  rewards: RewardStats | None = None
  episodes: EpisodeStats | None = None


@dataclasses.dataclass
class Rollout:
  """One step's batch on the host, prompt-major (B = P * G rows; G = 1 for demonstrations).

  Attributes:
    prompt_tokens, prompt_mask: int32 [P, S0], left-padded prompts.
    tokens, mask: int32 [B, N], completions (mask: the model's tokens, up to EOS).
    logprobs: float32 [B, N], the sampler's behaviour log-probs; None for demonstrations.
    lengths: int32 [B]; truncated: bool [B] (no EOS within N tokens).
    rewards: float32 [B], what the advantages are computed from (overlong-shaped).
    group_valid: bool [P]; False for groups that carry no loss (dynamic sampling's filler,
      an episode dropped on an environment error).
    position: the data position after this rollout (a checkpoint stores it).
    prompts, completions: the texts, for logging.
    stats: this process's rows of what the metrics describe (`RolloutStats`).
    metrics: host scalars (`summarize` fills them in on the trainer's thread).
    mixed: a mixed run's sources and positions (`Mixed`), else None.
    hinted: self-distillation's hinted prompts (`Hinted`), else None.
    episodes: what multi-turn episodes add (`EpisodeParts`), else None.
    routing: int32 [B, S0 + N, MoE layers, k], the experts an MoE policy's sampler routed
      each token to (-1: none recorded; `sampling.SampleOutput`), else None.
    step, policy_version: with asynchronous rollouts, the step this rollout is for and the
      policy version (updates done) that sampled it (its oldest token's); else None.
    in_flight: partial rollouts' samples still in flight after this batch: a function that
      writes them as JSON (what a checkpoint stores, `rollouts.partial`), else None.
    judge_flops: the model FLOPs `config.judge` spent scoring this process's rows.
  """
  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  tokens: np.ndarray
  mask: np.ndarray
  logprobs: np.ndarray | None
  lengths: np.ndarray
  truncated: np.ndarray
  rewards: np.ndarray
  group_valid: np.ndarray
  position: int
  prompts: list[str]
  completions: list[str]
  stats: RolloutStats
  metrics: dict = dataclasses.field(default_factory=dict)
  mixed: Mixed | None = None
  hinted: Hinted | None = None
  episodes: EpisodeParts | None = None
  routing: np.ndarray | None = None
  step: int | None = None
  policy_version: int | None = None
  in_flight: Callable[[], str] | None = None
  judge_flops: float = 0.0

  @property
  def attention(self) -> np.ndarray:
    """int32 [B, N]: the completion tokens attended to."""
    return self.mask if self.episodes is None else self.episodes.attention


@runtime_checkable
class RolloutSource(Protocol):
  """A producer of rollouts (single-turn sampling, episodes, demonstrations).

  `start` issues what every process must do together, in one order on every process (the
  sampling programs, agreeing on a prompt bucket, dynamic sampling's decision); `finish`
  completes it with no collective (reading this process's rows, decoding, scoring), so it
  may overlap another thread's programs; `summarize` gathers every process's stats into
  metrics (one collective: call it where the trainer's programs are issued).
  """

  def start(self, policy, key: jax.Array) -> Any:
    ...

  def finish(self, pending: Any) -> Rollout:
    ...

  def summarize(self, rollout: Rollout) -> dict[str, float]:
    ...

  def close(self) -> None:
    ...


def decode_completions(tokenizer, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
  """Each row's first `length` tokens as text, special tokens (EOS) dropped."""
  return tokenizer.batch_decode([row[:n].tolist() for row, n in zip(tokens, lengths)],
                                skip_special_tokens=True)


def prompt_aligned_routing(routing: np.ndarray, prompt_len: int, N: int) -> np.ndarray:
  """A sampler's routing [B, S + N, ...] for prompts of `prompt_len` columns: columns of
  left padding dropped, or -1 (nothing recorded) added on the left."""
  extra = prompt_len - (routing.shape[1] - N)
  if extra <= 0:
    return routing[:, -extra:]
  return np.pad(routing, ((0, 0), (extra, 0), (0, 0), (0, 0)), constant_values=-1)
