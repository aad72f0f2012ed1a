"""Held-out evaluation: greedy completions of the eval split, scored by the reward functions.

`Evaluator` is what the trainer logs under `eval/`: `eval/reward_mean` (the weighted
total) and `eval/reward/NAME` per reward function; the table it prints leads with the
first function's (`headline_key`, e.g. exact-match accuracy). A mixed run
(`config.sources`) evaluates every source's eval split with its own functions, under
`eval/SOURCE/reward_mean` and `eval/SOURCE/reward/NAME`, and its table leads with the first
source's. `greedy_samples` shows what it scores.
"""
from __future__ import annotations

import json

import jax
import numpy as np

from jaxrl_llm import config as config_lib
from jaxrl_llm import data, distributed, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.rewards import RewardSet, Rewards
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.training import rollouts
from jaxrl_llm.training.rollouts import episodes
from jaxrl_llm.training import setup as setup_lib


class Evaluator:
  """Greedy completions of the whole eval split; reward means under `eval/`."""

  def __init__(self, config, tokenizer, policy_config, source=None):
    """`source`: one of a mixed run's sources (`config.sources`), else `config.data`'s."""
    self.config, self.tokenizer = config, tokenizer
    data_cfg = config.data if source is None else sources_lib.data_config(config, source)
    self.dataset = data.load_dataset(data_cfg, "eval", task_options=data_cfg.task_options)
    self.reward_set = RewardSet.from_config(config.rewards if source is None else source.rewards)
    self.prefix = "" if source is None else f"{source.name}/"
    self.dataset_key = (data_cfg.source, data_cfg.task_options.to_dict(),
                        tuple((config.rewards if source is None else source.rewards).to_dict()
                              .items()))
    settings = sampling.settings.from_config(config.sampling,
                                             sampling.eos_ids(tokenizer, policy_config),
                                             sampling.pad_id(tokenizer), greedy=True)
    self.format = data.PromptFormat.from_config(config)
    self.sampler = sampling.Sampler(settings, config.sampling.prompt_buckets)
    resolved = source or sources_lib.run_sources(config)[0]
    self.player = (episodes.EpisodePlayer(resolved, tokenizer, settings)
                   if resolved.multi_turn else None)

  def complete(self, policy, batch: data.RecordBatch):
    """Greedy completions of `batch`'s prompts (texts; an episode's last model turn) and
    their `Rewards` (an episode's with its step rewards, `env`)."""
    if self.player is not None:
      played = self.player.play(episodes.local_model(policy), batch.records, batch.indices,
                                jax.random.PRNGKey(0))
      completions = [episodes.last_turn_text(self.tokenizer, ep) for ep in played]
      scored = self.reward_set(batch.prompts, completions, **batch.fields(),
                               **episodes.episode_fields(played))
      env = episodes.env_rewards(played)
      return completions, Rewards(scored.total + env, dict(scored.per_function, env=env))
    prompts = self.format.tokenize(self.tokenizer, batch.prompts, indices=batch.indices)
    out = self.sampler.sample_local(policy, prompts.token_lists, 0)
    completions = rollouts.decode_completions(self.tokenizer, out.tokens, out.lengths)
    return completions, self.reward_set(batch.prompts, completions, **batch.fields())

  def __call__(self, policy) -> dict[str, float]:
    values: dict[str, list] = {}
    valid: list[np.ndarray] = []
    for batch in data.sequential_batches(self.dataset, self.config.train.prompts_per_step,
                                         process_index=jax.process_index(),
                                         process_count=jax.process_count()):
      _, scored = self.complete(policy, batch)
      for name, v in [("", scored.total), *scored.per_function.items()]:
        values.setdefault(name, []).append(np.where(batch.valid, v, 0.0))
      valid.append(batch.valid)
    # Sums over every process's valid records (padding records count for nothing).
    sums, count = distributed.concat(({k: np.concatenate(v) for k, v in values.items()},
                                      np.concatenate(valid)))
    metrics = {f"eval/{self.prefix}reward/{k}" if k else f"eval/{self.prefix}reward_mean":
               float(v.sum() / count.sum()) for k, v in sums.items()}
    tools = self.player.tool_stats() if self.player is not None else {}
    if tools.get("calls"):  # the valid-call rate of the held-out episodes (padding included)
      metrics[f"eval/{self.prefix}env/tool_ok_frac"] = tools["ok"] / tools["calls"]
    return metrics

  def report(self, writer, step: int, policy, row: dict | None = None) -> dict[str, float]:
    """Evaluates `policy`, prints the table line of `step` (with `row`'s training
    metrics) through `writer`, and returns the eval metrics."""
    metrics = self(policy)
    writer.print(self.table_row(step, {**(row or {}), **metrics}))
    return metrics

  def table_row(self, step: int, row: dict[str, float]) -> str:
    first = self.reward_set.names[0]
    text = (f"step {step:5d} | held-out {self.prefix}{first} "
            f"{row[f'eval/{self.prefix}reward/{first}']:.3f}")
    for key, name in (("reward_mean", "train reward"), ("loss", "loss")):
      if key in row:
        text += f" | {name} {row[key]:.3f}"
    return text


class Evaluators:
  """Every source's `Evaluator` (one without `config.sources`); the table leads with the
  first's."""

  def __init__(self, config, tokenizer, policy_config):
    self.parts = ([Evaluator(config, tokenizer, policy_config)] if not len(config.sources) else
                  [Evaluator(config, tokenizer, policy_config, s)
                   for s in sources_lib.run_sources(config)])

  def __call__(self, policy) -> dict[str, float]:
    metrics, done = {}, {}
    for part in self.parts:  # sources of the same eval data and rewards are evaluated once
      key = json.dumps([part.dataset_key, part.reward_set.names], default=str)
      if key not in done:
        done[key] = {k[len(f"eval/{part.prefix}"):]: v for k, v in part(policy).items()}
      metrics.update({f"eval/{part.prefix}{k}": v for k, v in done[key].items()})
    return metrics

  def report(self, writer, step: int, policy, row: dict | None = None) -> dict[str, float]:
    metrics = self(policy)
    writer.print(self.parts[0].table_row(step, {**(row or {}), **metrics}))
    return metrics


def headline_key(rewards_cfg) -> str:
  """The eval metric of `config.rewards`' first function (`eval/reward/NAME`): what the
  trainer's table and the demo lead with."""
  return f"eval/reward/{RewardSet.from_config(rewards_cfg).names[0]}"


def greedy_samples(config, count: int, model_path: str = "", source: str = "") -> list[dict]:
  """What the evaluator scores, shown: the first `count` held-out records, answered greedily.

  Args:
    config: a full config (its model, data, sampling and rewards sections are read).
    count: how many records, from the start of the eval split.
    model_path: a Hugging Face directory to load instead of `config.model.path`, e.g. a
      finished run's `export/`.
    source: with `config.sources`, the source whose eval split to answer ('' = the first).

  Returns:
    One dict per record: `prompt`, `completion`, the record's other fields (`answer`, ...),
    `reward` (the weighted total) and `reward/NAME` for each reward function.
  """
  if model_path:
    config = config.copy_and_resolve_references()
    config.model.path = model_path
  config_lib.validate(config)
  mesh, rules = sh.split_meshes(config.mesh)[0], sh.freeze_rules(config.mesh.rules)
  tokenizer, policy = setup_lib.load_tokenizer_and_policy(config, mesh, rules)
  chosen = None
  if len(config.sources):
    names = [s.name for s in sources_lib.run_sources(config)]
    if source and source not in names:
      raise ValueError(f"source={source!r}: expected one of config.sources {names}")
    chosen = sources_lib.run_sources(config)[names.index(source) if source else 0]
  evaluator = Evaluator(config, tokenizer, policy.config, chosen)
  if not 0 < count <= len(evaluator.dataset):
    raise ValueError(f"count={count}: expected 1 to {len(evaluator.dataset)}, the size of the "
                     "eval split of " + (f"config.data.source={config.data.source!r}"
                                         if chosen is None else
                                         f"config.sources.{chosen.name}.data={chosen.data!r}"))
  batch = next(data.sequential_batches(evaluator.dataset, count, process_index=jax.process_index(),
                                       process_count=jax.process_count()))
  completions, scored = evaluator.complete(policy, batch)
  fields = batch.fields()
  return [{"prompt": prompt, "completion": completion, **{k: v[i] for k, v in fields.items()},
           "reward": float(scored.total[i]),
           **{f"reward/{name}": float(v[i]) for name, v in scored.per_function.items()}}
          for i, (prompt, completion) in enumerate(zip(batch.prompts, completions))]
