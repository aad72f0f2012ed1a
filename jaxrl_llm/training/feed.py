"""Where each step's rollout comes from: the training data, the rollout source the plan
names, and (with `plan.max_async_level > 0`) the asynchronous pipeline, behind one
interface for the trainer.
"""
from __future__ import annotations

import contextlib
import time

import jax
import numpy as np

from jaxrl_llm import data, sampling
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.rewards import RewardSet
from jaxrl_llm.training import async_rollouts, episodes
from jaxrl_llm.training import rollout as rollout_lib
from jaxrl_llm.training.plan import Plan
from jaxrl_llm.training.resume import Start
from jaxrl_llm.training.setup import Setup


def training_batches(config, plan: Plan, start: Start):
  """This process's prompt batches from `start` on: `config.data`'s, or a mixed run's from
  every source at once (`data.mixed_batches`)."""
  where = dict(process_index=jax.process_index(), process_count=jax.process_count())
  P, seed = config.train.prompts_per_step, config.data.shuffle_seed
  if plan.mixed:
    datasets = {s.name: data.load_dataset(sources_lib.data_config(config, s), "train",
                                           task_options=s.task_options) for s in plan.sources}
    return data.mixed_batches(datasets, {s.name: s.weight for s in plan.sources}, P, seed=seed,
                              start=start.data_position, positions=start.source_positions,
                              **where)
  load = data.load_dataset if plan.completions == "sample" else data.load_demonstrations
  records = load(config.data, "train", task_options=config.data.task_options)
  return data.prompt_batches(records, P, seed=seed, start=start.data_position, **where)


class Feed:
  """The rollout of every step from `start.step` on.

  Synchronous: `get(step, params)` samples and scores with `params` now. Asynchronous:
  a thread samples ahead (`async_rollouts.RolloutPipeline`) from the versions the
  trainer `publish`es; `get` waits for step `step`'s rollout.
  """

  def __init__(self, config, plan: Plan, setup: Setup, start: Start):
    self.models = setup.models
    self.step_key = lambda step: jax.random.fold_in(jax.random.PRNGKey(config.seed), step)
    batches = training_batches(config, plan, start)
    tokenizer, policy = setup.tokenizer, setup.models.policy
    eos = rollout_lib.eos_ids(tokenizer, policy.config)
    pad = rollout_lib.pad_id(tokenizer)
    settings = rollout_lib.sampling_settings(config.sampling, eos, pad)
    if plan.completions == "sample" and any(s.multi_turn for s in plan.sources):
      self.source = episodes.EpisodeRollouts(config, tokenizer, batches, plan.sources, settings,
                                             plan.mixed)
    elif plan.completions == "sample":
      sampler = sampling.Sampler(settings, config.sampling.prompt_buckets)
      self.source = rollout_lib.SampledRollouts(
          config, tokenizer, batches, sampler,
          [RewardSet.from_config(s.rewards) for s in plan.sources],
          [s.name for s in plan.sources] if plan.mixed else (),
          [data.Hint(s.algo.distill.hint_field, s.algo.distill.hint_template)
           if s.algo.distill.teacher == "self" else None for s in plan.sources]
          if plan.self_teacher else ())
    elif plan.sources[0].multi_turn:  # SFT on conversations: the model's turns are the targets
      self.source = episodes.ConversationRollouts(config, tokenizer, batches, plan.sources[0])
    else:
      self.source = rollout_lib.DatasetRollouts(config, tokenizer, batches, eos)
    self.pipeline = None
    if plan.max_async_level > 0:
      self.pipeline = async_rollouts.RolloutPipeline(
          self.source, setup.models.sampler_copy, setup.models.on_sampler,
          start=start.step,
          steps=config.train.steps, max_async_level=plan.max_async_level,
          step_key=self.step_key)
    self.staleness: list[int] = []  # per step since the last `async_metrics`

  def publish(self, version: int, params) -> None:
    """Hands the pipeline the policy after `version` updates (synchronous: nothing)."""
    if self.pipeline is not None:
      self.pipeline.publish(version, params)

  def turn(self, step: int):
    """The trainer's turn to issue the programs of step `step` (`start - 1`: those before the
    first step), a context manager: with a pipeline, every process issues its programs and
    the rollout thread's in one order (`async_rollouts.ProgramOrder`); else nothing."""
    if self.pipeline is None:
      return contextlib.nullcontext()
    return self.pipeline.order.trainer(step)

  def get(self, step: int, params) -> tuple[rollout_lib.Rollout, float, float]:
    """(step `step`'s rollout, seconds spent sampling it, seconds spent scoring it).

    With a pipeline the reward ran in its thread: the wait is all this step spent."""
    t0 = time.perf_counter()
    if self.pipeline is None:
      rollout = self.source(self.models.sampling_policy(params), self.step_key(step))
    else:
      rollout = self.pipeline.get(step)
      self.staleness.append(step - rollout.policy_version)
    rollout.metrics.update(self.source.summarize(rollout))
    t_reward = rollout.metrics.pop("reward_time_s", 0.0)
    t_sample = time.perf_counter() - t0 - (t_reward if self.pipeline is None else 0.0)
    return rollout, t_sample, t_reward

  def async_metrics(self, rollout: rollout_lib.Rollout) -> dict[str, float]:
    """Staleness since the last call (asynchronous rollouts only)."""
    if self.pipeline is None:
      return {}
    row = {"async/staleness_mean": float(np.mean(self.staleness)),
           "async/staleness_max": float(np.max(self.staleness)),
           "async/policy_version": float(rollout.policy_version)}
    self.staleness = []
    return row

  def close(self) -> None:
    if self.pipeline is not None:
      self.pipeline.close()
    if callable(getattr(self.source, "close", None)):
      self.source.close()
