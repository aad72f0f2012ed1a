"""K sampled completions per held-out record, scored: what pass@k and maj@K count.

`SampledEval` samples one source's records K times at the run's sampling temperature,
top-k and top-p (a single-turn source through the same `sampling.Sampler` as training, on
the config's mesh; a multi-turn one as K episodes per record through its episode player),
scores them with the source's reward functions (the weighted total, as `Evaluator` does)
and calls a sample correct when its total reaches `config.eval.correct_at`. The trainer's
`Evaluator` logs its pass@k (`pass_rates`) (`config.eval.num_samples` > 0); `launch.evaluate` also writes
every sample and its extracted answer (`training.answers`).

Keys: batch `position` of the split samples from fold_in(PRNGKey(seed), position), so an
evaluation repeated at another step draws the same way.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxrl_llm import data, distributed, sampling
from jaxrl_llm.config import reward_checks
from jaxrl_llm.config.sources import Source
from jaxrl_llm.rewards import Rewards
from jaxrl_llm.training import pass_at_k, rollouts
from jaxrl_llm.training.rollouts import episodes, players


@dataclasses.dataclass
class Samples:
  """The K samples of each of a batch's P records (this process's), record-major.

  Attributes:
    completions: P lists of K texts (an episode's last model turn).
    rewards: the samples' `Rewards` (totals and per function, float32 [P * K]).
    correct: bool [P, K]: the total reaches `correct_at`.
  """
  completions: list[list[str]]
  rewards: Rewards
  correct: np.ndarray

  @property
  def totals(self) -> np.ndarray:
    """float32 [P, K]: each sample's reward total."""
    return np.asarray(self.rewards.total, np.float32).reshape(self.correct.shape)


class SampledEval:
  """K samples of each record of one source, scored.

  Args:
    source: the source (its reward functions, its environment).
    settings: the sampler's settings (temperature, top-k, top-p; `num_samples` is set to K).
    prompt_format: how prompts are tokenised.
    tokenizer: the policy's tokenizer.
    num_samples: K, the samples per record.
    correct_at: the reward total from which a sample counts as correct.
    seed: the keys' root (module docstring).
    judge: `config.judge`'s model, if it scores this source.
  """

  def __init__(self, source: Source, settings: sampling.SamplingSettings,
               prompt_format: data.PromptFormat, tokenizer, num_samples: int,
               correct_at: float, seed: int = 0, judge=None):
    if num_samples < 1:
      raise ValueError(f"num_samples={num_samples}: expected >= 1 samples per record")
    self.K, self.correct_at, self.seed = num_samples, float(correct_at), seed
    self.format, self.tokenizer = prompt_format, tokenizer
    self.settings = dataclasses.replace(settings, num_samples=num_samples)
    self.reward_set = reward_checks.reward_set(source, judge)
    self.player = (players.player_for(source, tokenizer, self.settings)
                   if source.multi_turn else None)
    self.sampler = None if self.player else sampling.Sampler(self.settings, prompt_format.buckets)

  @classmethod
  def for_source(cls, config, tokenizer, policy_config, source: Source,
                 num_samples: int, judge=None) -> "SampledEval":
    """The sampled evaluation of a run's `source` with K = `num_samples`, from `config`."""
    settings = sampling.settings.from_config(config.sampling,
                                             sampling.eos_ids(tokenizer, policy_config),
                                             sampling.pad_id(tokenizer))
    return cls(source, settings, data.PromptFormat.from_config(config), tokenizer, num_samples,
               config.eval.correct_at, config.seed, judge)

  def model(self, policy):
    """The policy as `sample` takes it: on this process's first device for episodes (copy it
    once for every batch), else as it is."""
    return policy if self.player is None else episodes.local_model(policy)

  def sample(self, policy, batch: data.RecordBatch) -> Samples:
    """K samples of each of `batch`'s records by `policy` (`model`), scored."""
    K, P = self.K, len(batch.records)
    key = jax.random.fold_in(jax.random.PRNGKey(self.seed), batch.position)
    fields = batch.fields(repeat=K)
    prompts = [p for p in batch.prompts for _ in range(K)]
    if self.player is not None:  # episode r of the global batch draws from fold_in(key, r)
      rows = [jax.process_index() * P * K + r for r in range(P * K)]
      played = self.player.play(policy, [r for r in batch.records for _ in range(K)],
                                np.repeat(batch.indices, K), key, rows)
      texts = [episodes.last_turn_text(self.tokenizer, ep) for ep in played]
      scored = self.reward_set(prompts, texts, **fields, **episodes.episode_fields(played))
      env = episodes.env_rewards(played)
      scored = Rewards(scored.total + env, dict(scored.per_function, env=env))
    else:
      tokens = self.format.tokenize(self.tokenizer, batch.prompts, indices=batch.indices)
      out = self.sampler.sample_local(policy, tokens.token_lists, key)
      texts = rollouts.decode_completions(self.tokenizer, out.tokens, out.lengths)
      scored = self.reward_set(prompts, texts, **fields)
    correct = (np.asarray(scored.total) >= self.correct_at).reshape(P, K)
    return Samples([texts[p * K:(p + 1) * K] for p in range(P)], scored, correct)

  def pass_rates(self, policy, dataset, batch_size: int, ks) -> dict[int, float]:
    """pass@k for each of `ks` over the whole `dataset` (every process's records; each
    process samples its share of every batch of `batch_size`)."""
    policy = self.model(policy)
    values, valid = [], []
    for batch in data.sequential_batches(dataset, batch_size, process_index=jax.process_index(),
                                         process_count=jax.process_count()):
      correct = self.sample(policy, batch).correct
      values.append(np.stack([pass_at_k.pass_at_k_per_record(correct, k) for k in ks], 1))
      valid.append(batch.valid)
    # Every process's records; padding records count for nothing.
    values_RK, valid_R = distributed.concat((np.concatenate(values), np.concatenate(valid)))
    return {k: float(values_RK[valid_R, i].mean()) for i, k in enumerate(ks)}

  def close(self) -> None:
    if self.player is not None:
      self.player.close()
