"""Rollouts of multi-turn sources: episodes played by the policy (RL), and conversations
demonstrated in the data (SFT). How an episode is played and laid out: `episodes`."""
from __future__ import annotations

from typing import Iterator, Sequence

import jax
import numpy as np

from jaxrl_llm import data, envs, models, objectives, sampling
from jaxrl_llm.config.sources import Source
from jaxrl_llm.envs import episode as episode_lib
from jaxrl_llm.training.plan import Plan
from jaxrl_llm.training.rollouts import summary
from jaxrl_llm.training.rollouts.players import player_for
from jaxrl_llm.training.rollouts.contract import (EpisodeParts, EpisodeStats, Mixed,
                                                  RewardStats, Rollout, RolloutStats)
from jaxrl_llm.training.rollouts.episodes import (MODEL, episode_arrays, episode_fields,
                                                  env_rewards, last_turn_text, local_model,
                                                  opening_length)
from jaxrl_llm.training.rollouts.scoring import RowScorer


class EpisodeRollouts:
  """RL rollouts of multi-turn sources (`episodes`): G episodes per record, each source's
  played by its own `EpisodePlayer`, scored by its reward functions plus its step rewards.

  Args:
    plan: the run's plan (its sources, whether rows are mixed, `algo.echo`).
    settings: the sampler's settings (G: `num_samples`; `max_new_tokens`: one turn's).
    prompt_format: its `buckets` pad the episodes' openings.
    tokenizer: the policy's tokenizer.
    batches: this process's prompt batches.
    judge: `config.judge`'s model, for the sources it scores (None without one).
  """

  def __init__(self, plan: Plan, settings: sampling.SamplingSettings,
               prompt_format: data.PromptFormat, tokenizer,
               batches: Iterator[data.RecordBatch], judge=None):
    self.tokenizer, self.batches, self.buckets = tokenizer, batches, prompt_format.buckets
    self.G, self.pad, self.algo = settings.num_samples, settings.pad_id, plan.algo
    self.score_rows = RowScorer(plan.sources, plan.mixed, self.G, judge)
    self.players = [player_for(s, tokenizer, settings) for s in plan.sources]
    self.width = max(s.env["max_episode_tokens"] for s in plan.sources)
    self.echo = {k: float(v) for k, v in plan.algo.echo.items() if v}
    self.agents = any(s.env.get("agent") for s in plan.sources)
    self.K = plan.samples_per_episode

  def start(self, policy, key: jax.Array) -> tuple:
    """The step's batch, and the policy on this process's first device (`local_model`, the
    one program every process issues together); `finish` plays the episodes."""
    return local_model(policy), next(self.batches), key

  def finish(self, pending: tuple) -> Rollout:
    """Plays the episodes of this process's records (no collective: while another thread's
    programs run)."""
    return self.play(*pending)

  def summarize(self, rollout: Rollout) -> dict[str, float]:
    return summary.summarize(rollout.stats, self.score_rows.names, self.algo)

  def close(self) -> None:
    for player in self.players:
      player.close()

  def play(self, model: models.Model, batch: data.RecordBatch, key: jax.Array) -> Rollout:
    """The rollout of `batch`: G episodes per record, scored and laid out for training (K
    rows each with an agent's `agent_samples` K: its trajectories, the missing ones empty,
    every row with its episode's reward)."""
    sources = batch.sources if batch.sources is not None else np.zeros(len(batch.records),
                                                                          np.int32)
    return self.lay_out(batch, sources, self._play_sources(model, batch, sources, key))

  def lay_out(self, batch: data.RecordBatch, sources: np.ndarray, samples: list) -> Rollout:
    """The rollout of `batch`'s played episodes: `samples`, each episode's trajectories
    (prompt-major, G per record), scored and laid out for training, with the tool calls
    counted since the last rollout."""
    tool_stats = self._tool_stats()
    G, K, P = self.G, self.K, len(batch.records)
    episodes = [s[-1] for s in samples]
    rows = [ep for s in samples for ep in _padded(s, K)]
    arrays = episode_arrays(rows, G * K, self.width, self.buckets, self.pad, self.echo,
                            same_opening=not self.agents)
    prompts = [p for p in batch.prompts for _ in range(G)]
    scored = self.score_rows(batch, prompts, [last_turn_text(self.tokenizer, ep)
                                              for ep in episodes], episode_fields(episodes))
    env_reward = env_rewards(episodes)
    dropped = np.asarray([ep.ended == "env_error" for ep in episodes])
    total = np.where(dropped, 0.0, scored.total + env_reward).astype(np.float32)
    group_valid = ~dropped.reshape(P, G).any(axis=1)
    lengths = arrays.attention.sum(axis=1).astype(np.int32)
    truncated = np.asarray([ep.ended in ("max_new_tokens", "max_episode_tokens")
                            for ep in episodes])
    per_row = lambda x: np.repeat(np.asarray(x), K, axis=0)
    stats = RolloutStats(
        lengths=lengths, truncated=per_row(truncated), truncated_prompts=np.asarray([0]),
        rewards=RewardStats(
            per_function={k: per_row(v) for k, v in dict(scored.per_function,
                                                          env=env_reward).items()},
            total=per_row(total), shaped=per_row(total), group_valid=group_valid,
            informative=np.asarray(objectives.dynamic_sampling_keep(total.reshape(P, G))),
            sources=np.repeat(sources, G * K).astype(np.int32), rounds=np.asarray([1])),
        episodes=EpisodeStats(
            turns=np.asarray([ep.num_turns for ep in rows]),
            model_tokens=arrays.mask.sum(axis=1),
            ended=per_row([episode_lib.ENDINGS.index(ep.ended) for ep in episodes]).astype(np.int32),
            dropped=per_row(dropped), tool_stats={k: np.asarray([v]) for k, v in tool_stats.items()}))
    return Rollout(
        prompt_tokens=arrays.prompt_tokens, prompt_mask=arrays.prompt_mask,
        tokens=arrays.tokens, mask=arrays.mask, logprobs=arrays.logprobs, lengths=lengths,
        truncated=per_row(truncated), rewards=per_row(total), group_valid=group_valid,
        metrics={"reward_time_s": 0.0}, position=batch.position + 1, prompts=batch.prompts,
        completions=[last_turn_text(self.tokenizer, ep) for ep in rows], stats=stats,
        mixed=None if batch.sources is None else Mixed(batch.sources.astype(np.int32),
                                                       batch.source_positions),
        episodes=EpisodeParts(arrays.attention, [ep.as_row() for ep in rows],
                              echo_weights=arrays.echo_weights if self.echo else None,
                              turn_rewards=arrays.turn_rewards), routing=arrays.routing,
        judge_flops=self.score_rows.take_judge_flops())

  def _play_sources(self, model, batch: data.RecordBatch, sources: np.ndarray, key: jax.Array):
    """(each of the B episodes' trajectories, prompt-major (one, or an agent's up to K); the
    tool-call counts, the same keys on every process): each source's records played by its
    player, episode r of the step's global batch (this process's rows come after the
    earlier processes') from fold_in(fold_in(key, source index), r), so that what an episode
    samples does not depend on how many processes share the batch."""
    G, B = self.G, len(batch.records) * self.G
    samples: list = [None] * B
    for i, player in enumerate(self.players):
      prompts = np.flatnonzero(sources == i)
      rows = [p * G + g for p in prompts for g in range(G)]
      if rows:
        args = (model, [batch.records[p] for p in prompts for _ in range(G)],
                [batch.indices[p] for p in prompts for _ in range(G)], jax.random.fold_in(key, i))
        numbers = [jax.process_index() * B + r for r in rows]
        played = (player.play_samples(*args, self.K, numbers) if self.K > 1
                  else [[ep] for ep in player.play(*args, numbers)])
        for r, s in zip(rows, played):
          samples[r] = s
    return samples

  def _tool_stats(self) -> dict[str, int]:
    """Every player's tool-call counts since the last call, summed (the same keys on every
    process)."""
    total: dict[str, int] = {}
    for player in self.players:
      for k, v in player.tool_stats().items():
        total[k] = total.get(k, 0) + v
    return total


def _padded(samples: list, K: int) -> list:
  """An episode's K rows: its trajectories, after empty ones (its ending, no tokens)."""
  empty = episode_lib.Episode(ended=samples[-1].ended)
  return [empty] * (K - len(samples)) + list(samples[-K:])


def demonstrated_episode(env, renderer, record: dict, turns: Sequence[dict], where: str
                         ) -> episode_lib.Episode:
  """A demonstration as an episode: `env.reset(record)`'s opening, then `turns` (the
  conversation after it: the model's turns, role 'assistant', each closed by the
  end-of-turn token, and the environment's replies) appended as sampled turns would be."""
  opening = envs.as_messages(envs.call_env(env, "reset", dict(record), where=where), where)
  ep = episode_lib.Episode.start(renderer, opening)
  turns = envs.as_messages(list(turns), where, "the record's 'completion'")
  i = 0
  while i < len(turns):
    if turns[i]["role"] == MODEL:
      ids = renderer.encode(turns[i]["content"]) + [renderer.end_of_turn_id]
      ep.add_model_turn(ids, [0.0] * len(ids), turns[i]["content"])
      i += 1
      continue
    j = i
    while j < len(turns) and turns[j]["role"] != MODEL:
      j += 1
    if not ep.turn_lengths:
      raise envs.EnvError(f"{where}: the record's 'completion' starts with a {turns[i]['role']!r} "
                          "message: expected the model's turn first (the opening is reset()'s)")
    ep.add_env_messages(renderer, turns[i:j])
    i = j
  ep.end("done")
  return ep


class ConversationRollouts:
  """SFT on multi-turn demonstrations: each record's `completion` is the conversation after
  its environment's opening (a list of messages); the model's turns carry the loss, the
  environment's messages are attended to (what `DatasetRollouts` is for single turns)."""

  def __init__(self, source: Source, settings: sampling.SamplingSettings,
               prompt_format: data.PromptFormat, tokenizer, batches: Iterator[data.RecordBatch]):
    self.tokenizer, self.batches, self.buckets = tokenizer, batches, prompt_format.buckets
    self.env = envs.environment_for(source.env)
    self.renderer = envs.renderer_for(tokenizer, self.env)
    self.width, self.pad = source.env["max_episode_tokens"], settings.pad_id
    self.name = f"environment {source.env['env']!r}"

  def start(self, policy, key: jax.Array) -> Rollout:
    del policy, key
    batch = next(self.batches)
    played = []
    for index, record in zip(batch.indices, batch.records):
      where = f"{self.name}, record {int(index)}"
      if not isinstance(record.get("completion"), list):
        raise ValueError(f"{where}: expected the record's 'completion' to be a list of messages "
                         "(a conversation), which SFT with an environment needs; got "
                         f"{type(record.get('completion')).__name__}")
      ep = demonstrated_episode(self.env, self.renderer, record, record["completion"], where)
      if len(ep.tokens) - opening_length(ep) > self.width:
        raise ValueError(f"{where}: the demonstration has {len(ep.tokens)} tokens, more than "
                         f"max_episode_tokens={self.width}: expected a larger max_episode_tokens")
      played.append(ep)
    arrays = episode_arrays(played, 1, self.width, self.buckets, self.pad, {})
    P = len(played)
    lengths = arrays.attention.sum(axis=1).astype(np.int32)
    return Rollout(
        prompt_tokens=arrays.prompt_tokens, prompt_mask=arrays.prompt_mask,
        tokens=arrays.tokens, mask=arrays.mask, logprobs=None, lengths=lengths,
        truncated=np.zeros(P, bool), rewards=np.ones(P, np.float32),
        group_valid=np.ones(P, bool), position=batch.position + 1, prompts=batch.prompts,
        completions=[last_turn_text(self.tokenizer, ep) for ep in played],
        stats=RolloutStats(lengths, np.zeros(P, bool), np.asarray([0])),
        episodes=EpisodeParts(arrays.attention, [ep.as_row() for ep in played]))

  def finish(self, pending: Rollout) -> Rollout:
    return pending

  def summarize(self, rollout: Rollout) -> dict[str, float]:
    return summary.summarize(rollout.stats)

  def close(self) -> None:
    envs.loading.close(self.env)
