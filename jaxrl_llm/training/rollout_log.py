"""Rollouts a user can read: `DIR/rollouts.jsonl`, one row per sampled completion.

With `config.logging.rollouts_every = N > 0`, every N-th step writes one JSON object per
completion of its batch (every process's rows; process 0 writes):

  step                 the step the rollout trained (1-based, as metrics.jsonl)
  source               its source's name (`config.sources`), "default" in a one-source run
  policy_version       the policy that sampled it: updates done before it was sampled
  messages             the conversation by role: [{"role": "user", "content": prompt},
                       {"role": "assistant", "content": completion}]
  turn_tokens          tokens per message, in the same order ([prompt, completion])
  reward               the total of the reward functions; reward_parts: each function's
                       value (a mixed run names them SOURCE/FUNCTION); reward_shaped: what
                       the advantages saw (after overlong shaping, if on)
  ended                "eos" (the model stopped) or "max_new_tokens" (truncated)
  group_valid          false for a filler group of dynamic sampling (it carries no loss)
  tokens, loss_mask, behaviour_logprobs
                       aligned lists over the whole sequence, prompt included: the token
                       ids, 1 on the tokens the RL loss trains (the model's), and the
                       sampler's log-probs there (0 elsewhere)

A multi-turn source's row (`training.rollouts.episodes`) is one episode: `messages` is the whole
conversation, and it adds, per stretch of the episode in order (the opening, a model
turn, an environment reply, ...), `turn_roles`, `turn_messages` (messages in it) and
`turn_tokens`; `num_turns` and `turn_rewards` (the environment's reward per model turn;
with partial rollouts `turn_versions`, the policy version that sampled each);
`reward_parts` holds `env` (their sum) beside the reward functions'; `ended` is one of
done, eos, max_new_tokens, max_turns, max_episode_tokens, env_error.

A resumed run drops the rows of the steps it redoes, as metrics.jsonl does. The rows also go
to each tracker that keeps tables (`trackers`: wandb, mlflow, trackio), as one table a step.
"""
from __future__ import annotations

import json

import jax
import numpy as np

from jaxrl_llm import distributed, paths
from jaxrl_llm.training import trackers

FILE = "rollouts.jsonl"


class RolloutWriter:
  """Writes the rollouts of every `every`-th step to DIR/rollouts.jsonl (0: never) and to
  `tables.log_table` (the `metrics.MetricsWriter`'s trackers)."""

  def __init__(self, workdir: str, every: int, source_names: tuple[str, ...], start_step: int,
               tables):
    self.every, self.source_names = every, tuple(source_names) or ("default",)
    self.path, self.tables = paths.join(workdir, FILE), tables
    if every > 0 and jax.process_index() == 0:
      trackers.drop_rows_after(self.path, start_step)

  def due(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0

  def write(self, step: int, rollout, policy_version: int) -> None:
    """Appends step `step`'s rows (every process calls it: the rows are gathered)."""
    rows = rollout_rows(rollout, step, policy_version, self.source_names)
    if jax.process_index() == 0:
      paths.append(self.path, "".join(json.dumps(r) + "\n" for r in rows))
      self.tables.log_table(step, rows)


def episode_rows(rollout, step: int, policy_version: int,
                 source_names: tuple[str, ...]) -> list[dict]:
  """The rows of a multi-turn rollout (`Rollout.episodes.rows`), every process's."""
  B, P = rollout.tokens.shape[0], rollout.prompt_tokens.shape[0]
  G = B // P
  sources = np.zeros(P, np.int32) if rollout.mixed is None else rollout.mixed.sources
  rewards = rollout.stats.rewards
  total = rollout.rewards if rewards is None else rewards.total
  parts = {} if rewards is None else rewards.per_function
  rows = []
  for b, episode in enumerate(rollout.episodes.rows):
    p = b // G
    row = {"step": int(step), "source": source_names[int(sources[p])],
           "policy_version": int(policy_version)}
    row.update(episode)
    row.update(reward=float(total[b]),
               reward_parts={k: float(v[b]) for k, v in parts.items() if np.isfinite(v[b])},
               reward_shaped=float(rollout.rewards[b]),
               group_valid=bool(rollout.group_valid[p]))
    rows.append(row)
  texts = distributed.gather_strings([json.dumps(r) for r in rows])
  return [json.loads(t) for t in texts]


def rollout_rows(rollout, step: int, policy_version: int,
                 source_names: tuple[str, ...]) -> list[dict]:
  """The rows of a rollout, every process's (one gather per field)."""
  if rollout.episodes is not None:
    return episode_rows(rollout, step, policy_version, source_names)
  B, P = rollout.tokens.shape[0], rollout.prompt_tokens.shape[0]
  G, rewards = B // P, rollout.stats.rewards
  local = dict(prompt_tokens=rollout.prompt_tokens, prompt_mask=rollout.prompt_mask,
               tokens=rollout.tokens, mask=rollout.mask, lengths=rollout.lengths,
               truncated=rollout.truncated, shaped=rollout.rewards,
               group_valid=rollout.group_valid,
               logprobs=(np.zeros(rollout.tokens.shape, np.float32) if rollout.logprobs is None
                         else rollout.logprobs),
               sources=(np.zeros(P, np.int32) if rollout.mixed is None
                        else rollout.mixed.sources),
               total=rollout.rewards if rewards is None else rewards.total,
               parts={} if rewards is None else rewards.per_function)
  every = distributed.concat(local)
  prompts = distributed.gather_strings(list(rollout.prompts))
  completions = distributed.gather_strings(list(rollout.completions))
  rows = []
  for b in range(every["tokens"].shape[0]):
    p = b // G
    prompt = every["prompt_tokens"][p][every["prompt_mask"][p] > 0].tolist()
    n = int(every["lengths"][b])
    parts = {k: float(v[b]) for k, v in every["parts"].items() if np.isfinite(v[b])}
    rows.append({
        "step": int(step), "source": source_names[int(every["sources"][p])],
        "policy_version": int(policy_version),
        "messages": [{"role": "user", "content": prompts[p]},
                     {"role": "assistant", "content": completions[b]}],
        "turn_tokens": [len(prompt), n],
        "reward": float(every["total"][b]), "reward_parts": parts,
        "reward_shaped": float(every["shaped"][b]),
        "ended": "max_new_tokens" if every["truncated"][b] else "eos",
        "group_valid": bool(every["group_valid"][p]),
        "tokens": prompt + every["tokens"][b, :n].tolist(),
        "loss_mask": [0] * len(prompt) + every["mask"][b, :n].astype(int).tolist(),
        "behaviour_logprobs": [0.0] * len(prompt) + [float(x) for x in
                                                     every["logprobs"][b, :n]]})
  return rows
