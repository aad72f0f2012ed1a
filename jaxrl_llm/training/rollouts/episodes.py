"""Multi-turn rollouts: G episodes per prompt against a source's environment.

A source with an environment (`config.data.env`, `config.sources.NAME.env`; README
"Agents") is played as episodes: `env.reset(record)` opens a conversation, the policy
samples a turn, `env.step(conversation)` answers it, and so on until the environment is
done, `max_turns` model turns, or `max_episode_tokens` (`envs.episode` has the rules).
The batch's episodes advance together, one turn at a time, over one KV cache kept between
turns (`sampling.TurnSampler`: each turn prefills only what the environment added); their
environments are stepped concurrently by `env_workers` instances in threads. An episode
whose environment is done (or whose turn ended otherwise) sits the later turns out.

The tokens are appended, never re-tokenized: the model's as sampled, the environment's as
the chat template's suffix for its messages (`envs.ChatRenderer`), so the behaviour
log-probs are those of the sequence the trainer reads. In the training batch an episode is
its opening (the prompt, shared by its group) and everything after it in the completion
region, right-padded to `max_episode_tokens`: the attention covers all its tokens, the loss
mask only the model's, `echo_weights` the environment's tokens of the roles
`config.algo.echo` weighs, and `turn_rewards` puts each step's reward on its turn's last
token (what the token-level estimators, GAE, read).

The episode's reward is the sum of its step rewards (`reward/env`) plus the source's reward
functions, which score its last model turn as the completion and also receive the fields
`turns` (every model turn's text) and `messages` (the conversation).

An environment that raises stops the run with its `EnvError` (naming the environment, the
record and the turn), or with `on_env_error = 'drop'` ends that episode ('env_error'):
its group then carries no loss, counted in `env/dropped`.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
from typing import Sequence

import jax
import numpy as np

from jaxrl_llm import envs, models, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.config.sources import Source
from jaxrl_llm.envs import episode as episode_lib

MODEL = episode_lib.MODEL


def local_model(policy: models.Model) -> models.Model:
  """The policy on this process's first device, without a mesh (what TurnSampler and the
  serving engine run). Parameters sharded across processes are copied by `sh.transfer`:
  spread whole over each process's devices by one program, which every process issues
  (`async_rollouts.ProgramOrder` orders it with the others), each process then gathering
  its copy onto its first device."""
  device = jax.local_devices()[0]
  if jax.process_count() == 1:
    return models.Model(jax.device_put(policy.params, device), policy.config)
  here = jax.sharding.SingleDeviceSharding(device)
  return models.Model(sh.transfer(policy.params, jax.tree.map(lambda _: here, policy.params)),
                      policy.config)


class EpisodePlayer:
  """Plays batches of one source's episodes; owns its environments and turn sampler.

  Args:
    source: the source (its `env` fields).
    tokenizer: the policy's tokenizer (its chat template renders the episodes).
    settings: the sampler's settings (`max_new_tokens`: one turn's limit).
  """

  def __init__(self, source: Source, tokenizer, settings: sampling.SamplingSettings):
    self.source, self.fields = source, source.env
    self.envs = [envs.environment_for(self.fields) for _ in range(self.fields["env_workers"])]
    self.renderer = envs.renderer_for(tokenizer, self.envs[0])
    self.end_of_turn, self.eos = self.renderer.end_of_turn_id, tokenizer.eos_token_id
    self.settings = sampling.turn_settings(settings, self.end_of_turn)
    T, N = self.fields["max_episode_tokens"], settings.max_new_tokens
    # Each decode step reads every cache column: start with what most episodes need and
    # grow (rarely) up to what the longest could.
    self.sampler = sampling.TurnSampler(self.settings, T + N,
                                        grow_to=2 * T + self.fields["max_turns"] * (N + 8))
    self.idle: queue.Queue = queue.Queue()
    for env in self.envs:
      self.idle.put(env)
    self.pool = concurrent.futures.ThreadPoolExecutor(len(self.envs))
    self.name = f"environment {source.env['env']!r}" + (f" of source {source.name!r}"
                                                        if source.name else "")

  def _with_env(self, fn, *args):
    env = self.idle.get()
    try:
      return fn(env, *args)
    finally:
      self.idle.put(env)

  def _each(self, fn, items: list) -> list:
    """`fn(env, item)` for every item, on the idle environments, concurrently; an item whose
    call raised an EnvError gives the error."""
    def call(env, item):
      try:
        return fn(env, item)
      except envs.EnvError as e:
        if self.fields["on_env_error"] == "stop":
          raise
        return e
    return list(self.pool.map(lambda item: self._with_env(call, item), items))

  def _reset(self, env, job):
    record, where = job
    opening = envs.as_messages(envs.call_env(env, "reset", dict(record), where=where), where)
    return episode_lib.Episode.start(self.renderer, opening)

  def _step(self, env, job):
    conversation, where = job
    return envs.as_step_result(envs.call_env(env, "step", conversation, where=where), where)

  def play(self, model: models.Model, records: Sequence[dict], indices: Sequence[int],
           key: jax.Array, rows: Sequence[int] | None = None) -> list[episode_lib.Episode]:
    """One episode per record (repeat a record for G episodes), all ended. `model`: on one
    device (`local_model`); episode b draws from fold_in(key, b), or fold_in(key, rows[b])
    (`TurnSampler`; its row in a batch spanning processes)."""
    T, N = self.fields["max_episode_tokens"], self.settings.max_new_tokens
    where = [f"{self.name}, record {int(i)}" for i in indices]
    episodes = self._each(self._reset, list(zip(records, where)))
    for b, ep in enumerate(episodes):
      if isinstance(ep, envs.EnvError):
        episodes[b] = episode_lib.Episode()
        episodes[b].end("env_error")
      elif len(ep.tokens) >= T:
        raise envs.EnvError(f"{where[b]}: the opening messages are {len(ep.tokens)} tokens, "
                            f"which leaves no room within {self.source.field}."
                            f"max_episode_tokens={T}: expected more")
    new = [list(ep.tokens) if ep.ended is None else [] for ep in episodes]
    self.sampler.start(model, len(episodes), key, rows)
    for turn in range(1, self.fields["max_turns"] + 1):
      budgets = [min(N, T - len(ep.tokens)) if ep.ended is None else 0 for ep in episodes]
      if not any(budgets):
        break
      out = self.sampler.turn(model, [n if b else [] for n, b in zip(new, budgets)], budgets)
      stepping = []
      for b, ep in enumerate(episodes):
        if not budgets[b]:
          continue
        n = int(out.lengths[b])
        ids = out.tokens[b, :n].tolist()
        ep.add_model_turn(ids, out.logprobs[b, :n].tolist(), self.renderer.decode_turn(ids))
        if ids[-1] != self.end_of_turn:
          ep.end("eos" if ids[-1] == self.eos else
                 "max_new_tokens" if n == N else "max_episode_tokens")
        else:
          stepping.append(b)
      results = self._each(self._step, [([dict(m) for m in episodes[b].messages],
                                         f"{where[b]}, turn {turn}") for b in stepping])
      new = [[] for _ in episodes]
      for b, result in zip(stepping, results):
        ep = episodes[b]
        if isinstance(result, envs.EnvError):
          ep.end("env_error")
          continue
        ep.turn_rewards[-1], ep.turn_infos[-1] = result.reward, result.info
        if result.done:
          ep.end("done")
        elif turn == self.fields["max_turns"]:
          ep.end("max_turns")
        elif ep.add_env_messages(self.renderer, result.messages, T):
          new[b] = ep.tokens[-(ep.parts[-1][2] + 1):]  # the turn's last token, then the reply
    for ep in episodes:
      if ep.ended is None:  # every budget was 0: no room left
        ep.end("max_episode_tokens")
    for ep, routing in zip(episodes, self.sampler.routing() or ()):  # an MoE policy's experts
      ep.routing = routing
    return episodes

  def tool_stats(self) -> dict[str, int]:
    """The tool-call counts of every environment since the last call (ToolEnvs only)."""
    total: dict[str, int] = {}
    for env in self.envs:
      stats = getattr(env, "tool_stats", None)
      if stats is not None:
        for k, v in stats.take().items():
          total[k] = total.get(k, 0) + v
    return total

  def close(self) -> None:
    self.pool.shutdown(wait=True)
    for env in self.envs:
      envs.loading.close(env)


def last_turn_text(tokenizer, ep: episode_lib.Episode) -> str:
  """The model's last turn as the reward functions' completion (special tokens dropped)."""
  if not ep.turn_lengths:
    return ""
  n = ep.turn_lengths[-1]
  ids = [t for t, r in zip(ep.tokens[-n:], ep.roles[-n:]) if r == MODEL] if n else []
  return tokenizer.decode(ids, skip_special_tokens=True)


def episode_fields(episodes: Sequence[episode_lib.Episode]) -> dict[str, list]:
  """The reward functions' extra fields of episodes (`reward_checks.EPISODE_FIELDS`, which
  the preflight counts as present): `turns` (the model's turns' texts) and `messages` (the
  conversation)."""
  return dict(turns=[[m["content"] for m in ep.messages if m["role"] == MODEL]
                     for ep in episodes],
              messages=[[dict(m) for m in ep.messages] for ep in episodes])


def env_rewards(episodes: Sequence[episode_lib.Episode]) -> np.ndarray:
  """Each episode's step rewards summed: float32 [B] (the reward part `env`)."""
  return np.asarray([sum(ep.turn_rewards) for ep in episodes], np.float32)


def opening_length(ep: episode_lib.Episode) -> int:
  return ep.parts[0][2] if ep.parts else 0


@dataclasses.dataclass
class EpisodeArrays:
  """A batch of episodes laid out for training (`episode_arrays`)."""
  prompt_tokens: np.ndarray  # int32 [P, S0], the openings, left-padded
  prompt_mask: np.ndarray
  tokens: np.ndarray  # int32 [B, width], the rest, right-padded
  mask: np.ndarray  # the model's tokens (the loss mask)
  attention: np.ndarray  # every token of the episode
  logprobs: np.ndarray  # float32 [B, width], the behaviour log-probs (0 elsewhere)
  echo_weights: np.ndarray  # float32 [B, width], echo's weight of each environment token
  turn_rewards: np.ndarray  # float32 [B, width], each step's reward on its turn's last token
  routing: np.ndarray | None = None  # int32 [B, S0 + width, MoE layers, k], or None


def _shared_prefix(rows: Sequence[Sequence[int]]) -> list[int]:
  n = min(len(r) for r in rows)
  for i in range(n):
    if any(r[i] != rows[0][i] for r in rows):
      return list(rows[0][:i])
  return list(rows[0][:n])


def _openings(episodes, G: int, same_opening: bool) -> list[list[int]]:
  """Each group's prompt: its episodes' opening (`same_opening`: they must agree), else the
  tokens every episode of the group starts with."""
  openings = []
  for p in range(len(episodes) // G):
    group = [ep for ep in episodes[p * G:(p + 1) * G] if ep.tokens]
    if not same_opening:  # what their openings share (never a model token)
      shared = _shared_prefix([ep.tokens[:opening_length(ep)] for ep in group]) if group else []
      if group and not shared:
        raise envs.EnvError(f"the {G} episodes of record {p} of the batch share no first "
                            "token: expected a common start (a group shares its prompt)")
      openings.append(shared)
      continue
    firsts = [tuple(ep.tokens[:opening_length(ep)]) for ep in group]
    if len(set(firsts)) > 1:
      raise envs.EnvError(f"reset() gave the {G} episodes of a record different openings: "
                          "expected the same for all (a group shares its prompt)")
    openings.append(list(firsts[0]) if firsts else [])
  return openings


def episode_arrays(episodes: Sequence[episode_lib.Episode], G: int, width: int,
                   prompt_buckets: Sequence[int], pad: int, echo: dict[str, float],
                   same_opening: bool = True) -> EpisodeArrays:
  """The batch's arrays of B = P * G episodes (prompt-major): the opening as the prompt
  [P, S0] (left-padded to a bucket), the rest [B, width] (right-padded) with the loss mask
  (the model's tokens), attention, behaviour log-probs, echo weights and turn rewards.
  Without `same_opening` (agent programs, whose episodes' first calls may differ), a group's
  prompt is what its episodes share, and the rest of each opening is attended, not
  trained."""
  B = len(episodes)
  openings = _openings(episodes, G, same_opening)
  S0 = sampling.bucket_length(max(1, max(len(o) for o in openings)), prompt_buckets)
  prompt_tokens, prompt_mask = sampling.left_pad(openings, S0, pad)
  prompt_mask[:, -1] = 1  # a group dropped at reset still attends to one (pad) token
  shape = (B, width)
  tokens, mask, attention = np.full(shape, pad, np.int32), np.zeros(shape, np.int32), \
      np.zeros(shape, np.int32)
  logprobs, echo_w, turn_rewards = (np.zeros(shape, np.float32) for _ in range(3))
  for b, ep in enumerate(episodes):
    start = len(openings[b // G]) if ep.tokens else 0
    rest = ep.tokens[start:]
    if len(rest) > width:
      raise ValueError(f"episode {b} has {len(rest)} tokens after its opening, more than the "
                       f"batch's {width}")
    n = len(rest)
    roles = ep.roles[start:]
    tokens[b, :n] = rest
    attention[b, :n] = 1
    mask[b, :n] = [r == MODEL for r in roles]
    logprobs[b, :n] = ep.logprobs[start:]
    for t, role in enumerate(roles):
      if role != MODEL:
        echo_w[b, t] = echo.get(role.split("+")[0], 0.0)
    ends = np.flatnonzero(mask[b, :n] & ~np.r_[mask[b, 1:n], 0].astype(bool))
    for turn, t in enumerate(ends[:len(ep.turn_rewards)]):
      turn_rewards[b, t] = ep.turn_rewards[turn]
  return EpisodeArrays(prompt_tokens, prompt_mask, tokens, mask, attention, logprobs, echo_w,
                       turn_rewards, _routing(episodes, [len(openings[b // G]) for b in range(B)],
                                              S0, width))


def _routing(episodes, openings: list[int], S0: int, width: int) -> np.ndarray | None:
  """Each episode's recorded experts laid out as its row: its opening's at the end of the
  S0 prompt columns, the rest from column S0 on; -1 where nothing was recorded."""
  if any(ep.routing is None for ep in episodes):
    return None
  L, k = next(ep.routing.shape[1:] for ep in episodes)
  out = np.full((len(episodes), S0 + width, L, k), -1, np.int32)
  for b, (ep, n) in enumerate(zip(episodes, openings)):
    fed = np.asarray(ep.routing)[:len(ep.tokens)]
    n = min(n, len(fed)) if ep.tokens else 0
    out[b, S0 - n:S0] = fed[:n]
    out[b, S0:S0 + len(fed) - n] = fed[n:]
  return out
