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
from jaxrl_llm.training import async_rollouts, rollouts
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
    tokenizer = setup.tokenizer
    settings = sampling.settings.from_config(
        config.sampling, sampling.eos_ids(tokenizer, setup.models.policy.config),
        sampling.pad_id(tokenizer))
    self.rollouts = rollouts.for_plan(plan, settings, data.PromptFormat.from_config(config),
                                      tokenizer, training_batches(config, plan, start),
                                      setup.judge)
    if start.in_flight and plan.partial:  # samples a checkpoint kept in flight
      self.rollouts.restore(start.in_flight)
    self.pipeline = None
    if plan.max_async_level > 0:
      self.pipeline = async_rollouts.RolloutPipeline(
          self.rollouts, setup.models.sampler_copy, setup.models.on_sampler,
          start=start.step, steps=config.train.steps,
          # partial rollouts sample one update fresher (`rollouts.partial`, "Versions")
          max_async_level=plan.max_async_level - plan.partial,
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

  def get(self, step: int, params) -> tuple[rollouts.Rollout, float, float]:
    """(step `step`'s rollout, seconds spent sampling it, seconds spent scoring it).

    With a pipeline the reward ran in its thread: the wait is all this step spent."""
    t0 = time.perf_counter()
    if self.pipeline is None:
      pending = self.rollouts.start(self.models.sampling_policy(params), self.step_key(step))
      rollout = self.rollouts.finish(pending)
    else:
      rollout = self.pipeline.get(step)
      self.staleness.append(step - rollout.policy_version)
    rollout.metrics.update(self.rollouts.summarize(rollout))
    t_reward = rollout.metrics.pop("reward_time_s", 0.0)
    t_sample = time.perf_counter() - t0 - (t_reward if self.pipeline is None else 0.0)
    return rollout, t_sample, t_reward

  def async_metrics(self, rollout: rollouts.Rollout) -> dict[str, float]:
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
    self.rollouts.close()
