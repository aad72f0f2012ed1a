"""A rollout's metrics, from every process's `RolloutStats` (what each source's
`summarize` returns)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxrl_llm import distributed
from jaxrl_llm.envs import episode as episode_lib
from jaxrl_llm.training.rollouts.contract import EpisodeStats, RolloutStats


def summarize(stats: RolloutStats, source_names: Sequence[str] = (), algo=None
              ) -> dict[str, float]:
  """The metrics of the global batch (gathers every process's `stats`: one collective).

  Rewards (sampled rollouts; `algo`: the run's `config.algo`): `reward/NAME` (per source in
  a mixed run, `source_names`), `reward_mean`, `reward_std`, `zero_variance_group_frac`;
  lengths: `response_length_mean`, `truncated_frac`, `prompts_truncated`; dynamic
  sampling's and overlong shaping's when on; episodes: `episode_metrics`.
  """
  every = distributed.concat(stats)
  metrics = {} if every.rewards is None else _reward_metrics(every, source_names)
  metrics.update(response_length_mean=float(every.lengths.mean()),
                 truncated_frac=float(every.truncated.mean()),
                 prompts_truncated=float(every.truncated_prompts.sum()))
  if every.rewards is not None:
    if algo.dynamic_sampling.enabled:
      metrics.update(dynamic_sampling_rounds=float(every.rewards.rounds[0]),
                     dynamic_sampling_filler_frac=float(1 - every.rewards.group_valid.mean()))
    if algo.overlong.enabled:
      metrics["reward_shaped_mean"] = float(every.rewards.shaped.mean())
  if every.episodes is not None:
    metrics.update(episode_metrics(every.episodes))
  return metrics


def _reward_metrics(every: RolloutStats, source_names: Sequence[str]) -> dict[str, float]:
  rewards = every.rewards
  if not source_names:
    metrics = {f"reward/{k}": float(v.mean()) for k, v in rewards.per_function.items()}
  else:
    metrics = _source_metrics(every, source_names)
  metrics.update(reward_mean=float(rewards.total.mean()), reward_std=float(rewards.total.std()),
                 zero_variance_group_frac=float(np.mean(~rewards.informative)))
  return metrics


def _source_metrics(every: RolloutStats, source_names: Sequence[str]) -> dict[str, float]:
  """A mixed batch's metrics per source: `rows/NAME`, `reward_mean/NAME`,
  `response_length_mean/NAME`, `truncated_frac/NAME` and `reward/NAME/FUNCTION` (means over
  that source's rows of every process; only `rows/NAME` when it has none)."""
  metrics, rewards = {}, every.rewards
  for i, name in enumerate(source_names):
    rows = rewards.sources == i
    metrics[f"rows/{name}"] = float(rows.sum())
    if not rows.any():
      continue
    metrics[f"reward_mean/{name}"] = float(rewards.total[rows].mean())
    metrics[f"response_length_mean/{name}"] = float(every.lengths[rows].mean())
    metrics[f"truncated_frac/{name}"] = float(every.truncated[rows].mean())
    for key, values in rewards.per_function.items():
      if key.startswith(f"{name}/"):
        metrics[f"reward/{key}"] = float(values[rows].mean())
  return metrics


def episode_metrics(every: EpisodeStats) -> dict[str, float]:
  """`env/turns_mean`, `env/model_tokens_mean`, `env/ended/WHY` (fractions), `env/dropped`,
  with tools `env/tool_calls`, `env/tool_ok_frac` (the valid-call rate) and
  `env/tool_CATEGORY`, and with agent programs `env/agent_COUNT` (`rollouts.agents`)."""
  metrics = {"env/turns_mean": float(every.turns.mean()),
             "env/model_tokens_mean": float(every.model_tokens.mean())}
  for i, why in enumerate(episode_lib.ENDINGS):
    metrics[f"env/ended/{why}"] = float(np.mean(every.ended == i))
  metrics["env/dropped"] = float(every.dropped.sum())
  counts = {k: float(v.sum()) for k, v in every.tool_stats.items()}
  metrics.update({f"env/{k}": v for k, v in counts.items() if k.startswith("agent_")})
  tools = {k: v for k, v in counts.items() if not k.startswith("agent_")}
  if tools:
    metrics["env/tool_calls"] = tools["calls"]
    metrics["env/tool_ok_frac"] = tools["ok"] / tools["calls"] if tools["calls"] else 0.0
    metrics.update({f"env/tool_{k}": v for k, v in tools.items() if k != "calls"})
  return metrics
