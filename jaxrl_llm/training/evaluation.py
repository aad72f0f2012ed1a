"""Held-out evaluation: greedy completions of the eval split, scored by the reward functions.

`Evaluator` is what the trainer logs under `eval/`: `eval/reward_mean` (the weighted
total) and `eval/reward/NAME` per reward function; the table it prints leads with the
first function's (`headline_key`, e.g. exact-match accuracy). A mixed run
(`config.sources`) evaluates every source's eval split with its own functions, under
`eval/SOURCE/reward_mean` and `eval/SOURCE/reward/NAME`, and its table leads with the first
source's. With `config.eval.num_samples` = K > 0 it also samples every record K times
(`sampled_eval`) and logs pass@k for the k's of `config.eval.pass_k` (default 1, 2, 4, ...,
K) under `eval/pass@k/k` (`eval/SOURCE/pass@k/k`). `greedy_samples` shows what it scores.
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
from jaxrl_llm.config import reward_checks
from jaxrl_llm.config.sources import Source
from jaxrl_llm.training import pass_at_k, rollouts
from jaxrl_llm.training.rollouts import episodes, players
from jaxrl_llm.training import setup as setup_lib
from jaxrl_llm.training.sampled_eval import SampledEval


class Evaluator:
  """Greedy completions of one source's whole eval split; reward means under `eval/`
  (`eval/NAME/` for source NAME of a mixed run).

  Args:
    source: the source (`config.sources`' resolved: its reward functions, environment).
    dataset: its eval split.
    settings: the greedy sampler's settings (one temperature-0 sample per prompt).
    prompt_format: how prompts are tokenised.
    tokenizer: the policy's tokenizer.
    batch_size: prompts per sampling call (the run's `prompts_per_step`).
    sampled: K samples per record for pass@k (`sampled_eval`), or None (greedy only).
    pass_ks: the k's of pass@k (with `sampled`).
    judge: `config.judge`'s model, if it scores this source.
  """

  def __init__(self, source: Source, dataset, settings: sampling.SamplingSettings,
               prompt_format: data.PromptFormat, tokenizer, batch_size: int,
               sampled: SampledEval | None = None, pass_ks: tuple[int, ...] = (), judge=None):
    self.dataset, self.format, self.tokenizer = dataset, prompt_format, tokenizer
    self.batch_size = batch_size
    self.reward_set = reward_checks.reward_set(source, judge)
    self.prefix = f"{source.name}/" if source.name else ""
    self.dataset_key = (source.data, source.task_options,
                        tuple(source.rewards.to_dict().items()))
    self.sampler = sampling.Sampler(settings, prompt_format.buckets)
    self.player = (players.player_for(source, tokenizer, settings)
                   if source.multi_turn else None)
    self.sampled, self.pass_ks = sampled, tuple(pass_ks)

  @classmethod
  def for_source(cls, config, tokenizer, policy_config, source: Source,
                 judge=None) -> "Evaluator":
    """The evaluator of a run's `source` (`sources.run_sources`), built from `config`;
    `judge`: `config.judge`'s model (None without one)."""
    settings = sampling.settings.from_config(config.sampling,
                                             sampling.eos_ids(tokenizer, policy_config),
                                             sampling.pad_id(tokenizer), greedy=True)
    data_cfg = sources_lib.data_config(config, source)
    dataset = data.load_dataset(data_cfg, "eval", task_options=data_cfg.task_options)
    K, sampled, ks = config.eval.num_samples, None, ()
    if K > 0:
      sampled = SampledEval.for_source(config, tokenizer, policy_config, source, K, judge)
      ks = pass_at_k.resolve_ks(config.eval.pass_k, K)
    return cls(source, dataset, settings, data.PromptFormat.from_config(config), tokenizer,
               config.train.prompts_per_step, sampled, ks, judge)

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
    # One copy on this process's first device for every batch of episodes.
    greedy = policy if self.player is None else episodes.local_model(policy)
    for batch in data.sequential_batches(self.dataset, self.batch_size,
                                         process_index=jax.process_index(),
                                         process_count=jax.process_count()):
      _, scored = self.complete(greedy, batch)
      for name, v in [("", scored.total), *scored.per_function.items()]:
        values.setdefault(name, []).append(np.where(batch.valid, v, 0.0))
      valid.append(batch.valid)
    # Sums over every process's valid records (padding records count for nothing).
    sums, count = distributed.concat(({k: np.concatenate(v) for k, v in values.items()},
                                      np.concatenate(valid)))
    metrics = {f"eval/{self.prefix}reward/{k}" if k else f"eval/{self.prefix}reward_mean":
               float(v.sum() / count.sum()) for k, v in sums.items()}
    tools = self.player.tool_stats() if self.player is not None else {}
    if tools:  # every process's calls
      tools = {k: int(v.sum()) for k, v in distributed.concat(
          {k: np.asarray([v]) for k, v in tools.items()}).items()}
    if tools.get("calls"):  # the valid-call rate of the held-out episodes (padding included)
      metrics[f"eval/{self.prefix}env/tool_ok_frac"] = tools["ok"] / tools["calls"]
    if self.sampled is not None:
      rates = self.sampled.pass_rates(policy, self.dataset, self.batch_size, self.pass_ks)
      metrics.update({f"eval/{self.prefix}pass@k/{k}": v for k, v in rates.items()})
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

  def __init__(self, config, tokenizer, policy_config, judge=None):
    self.parts = [Evaluator.for_source(config, tokenizer, policy_config, s, judge)
                  for s in sources_lib.run_sources(config)]

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
  judge = setup_lib.load_judge(config)  # a reward function of the sources, if any
  run_sources = sources_lib.run_sources(config)
  names = [s.name for s in run_sources]
  if len(config.sources) and source and source not in names:
    raise ValueError(f"source={source!r}: expected one of config.sources {names}")
  chosen = run_sources[names.index(source) if source and len(config.sources) else 0]
  evaluator = Evaluator.for_source(config, tokenizer, policy.config, chosen, judge)
  if not 0 < count <= len(evaluator.dataset):
    raise ValueError(f"count={count}: expected 1 to {len(evaluator.dataset)}, the size of the "
                     "eval split of " + (f"config.sources.{chosen.name}.data={chosen.data!r}"
                                         if chosen.name else
                                         f"config.data.source={config.data.source!r}"))
  batch = next(data.sequential_batches(evaluator.dataset, count, process_index=jax.process_index(),
                                       process_count=jax.process_count()))
  completions, scored = evaluator.complete(policy, batch)
  fields = batch.fields()
  return [{"prompt": prompt, "completion": completion, **{k: v[i] for k, v in fields.items()},
           "reward": float(scored.total[i]),
           **{f"reward/{name}": float(v[i]) for name, v in scored.per_function.items()}}
          for i, (prompt, completion) in enumerate(zip(batch.prompts, completions))]
