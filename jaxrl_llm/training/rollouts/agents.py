"""Episodes played by agent programs through the policy's own OpenAI-compatible endpoint.

A source with `agent = "path/to/agent.py:run"` (instead of an environment) names

  async def run(client: openai.AsyncOpenAI, record: dict) -> reward | (reward, info)

`AgentPlayer` serves the current policy (`serving.Engine` on this process's first device,
behind `serving.Server` on a free loopback port), and for every episode opens an episode
scope on it and runs the program with a client bound to that scope. Up to `env_workers`
programs run at once, their calls batched by the engine. When a program returns, its
episode is assembled from the endpoint's log of its calls (`episode_samples`): the calls
that continue one another token-exactly (`serving.backend`) form a trajectory; the model's
tokens carry the loss with the engine's behaviour log-probs, everything the program added
between calls (tool results, user turns) is attended to but not imitated. The program's
reward sits on the last model turn (`reward/env`).

The episode's trajectory is the chain of calls that ends at its last call. A call that does
not continue the previous one (the program edited its history, or the chat template
rewrites earlier turns) starts another: with `agent_samples` K > 1 the episode gives up
to K trajectories, each its own row with the episode's reward (the batch has P x G x K
rows, an episode's missing ones empty); calls in none are counted
(`env/agent_untrained_calls`), the rows trained in `env/agent_samples` (docs/agents.md).

A call past `max_turns` calls, or whose prompt leaves no room in `max_episode_tokens`, is
answered with an empty message (finish reason 'length') and ends the episode there
(`ended`: 'max_turns', 'max_episode_tokens'), as an environment's episode ends; the program's
reward still counts. An agent that raises follows `on_env_error` ('stop': the run stops naming the agent and the
record; 'drop': the episode is dropped, `env/dropped`). One that runs past
`agent_timeout_s` is cancelled and dropped (`env/agent_timeouts`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import threading
import uuid
from typing import Sequence

import jax
import numpy as np

from jaxrl_llm import envs, import_path, models, sampling, serving
from jaxrl_llm.config.sources import Source
from jaxrl_llm.envs import episode as episode_lib

MODEL_NAME = "policy"  # what the episode scope serves (any `model` an agent names is accepted)


def load_agent(spec: str, field: str):
  """The agent program `spec` names ('path.py:run' or 'pkg.module:run'): an async function."""
  run = import_path.load_function(spec, field=field)
  if not inspect.iscoroutinefunction(run):
    raise ValueError(f"{field}={spec!r}: expected an `async def run(client, record)`, got "
                     f"{type(run).__name__} {getattr(run, '__name__', '')!r}")
  return run


def _raw_key(key) -> np.ndarray:
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return np.asarray(key)


def _chain(calls: Sequence[serving.Call], last: int, taken: set) -> list[tuple[int, int]]:
  """The (call, choice) links that call `last` continues, back to the first, or to a call
  already in a trajectory (`taken`), oldest first."""
  chain, at = [], (last, 0)
  while at is not None and at[0] not in taken:
    chain.append(at)
    at = calls[at[0]].extends
  return chain[::-1]


def _episode(calls: Sequence[serving.Call], chain, end_of_turn: int, eos: int | None,
             width: int) -> episode_lib.Episode:
  """The trajectory of `chain`: its first call's prompt, then each answer and what the next
  call added after it."""
  first = calls[chain[0][0]]
  ep = episode_lib.Episode(tools=[dict(t) for t in first.tools] if first.tools else None)
  ep.append(first.prompt_ids, episode_lib.PROMPT, first.messages)
  for (c, j), nxt in zip(chain, chain[1:] + [None]):
    choice = calls[c].choices[j]
    ep.add_model_turn(choice.tokens, choice.logprobs, choice.text)
    if nxt is not None:
      following = calls[nxt[0]]
      ep.append(following.prompt_ids[len(ep.tokens):],
                "+".join(dict.fromkeys(following.added_roles)),
                following.messages[len(calls[c].messages) + 1:])
  last = ep.tokens[-1]
  ep.end("done" if last == end_of_turn else "eos" if last == eos else
         "max_episode_tokens" if len(ep.tokens) >= width else "max_new_tokens")
  ep.routing = _fed_routing(calls[chain[-1][0]].choices[chain[-1][1]].routing, len(ep.tokens))
  return ep


def _fed_routing(routing, length: int):
  """An MoE policy's record of a trajectory's last call (`serving.Choice.routing`: its
  prompt, which is the whole trajectory before the answer, then the answer but its last
  token), for the trajectory's `length` tokens; -1 throughout (nothing replayed) should the
  engine's sequence not be the trajectory's."""
  if routing is None:
    return None
  routing = np.asarray(routing, np.int32)
  if len(routing) != length - 1:
    return np.full((length - 1,) + routing.shape[1:], -1, np.int32)
  return routing


def episode_samples(calls: Sequence[serving.Call], end_of_turn: int, eos: int | None,
                    width: int, most: int = 1) -> tuple[list[episode_lib.Episode], int]:
  """(an episode's trajectories, oldest first, at most `most`; its calls in none of them).

  The last is the chain of calls that ends at the last call; the others end at the latest
  call not yet in one, each back to its first call or to a call already taken."""
  taken: set = set()
  chains = []
  for last in range(len(calls) - 1, -1, -1):
    if len(chains) == most:
      break
    if last not in taken:
      chain = _chain(calls, last, taken)
      taken.update(c for c, _ in chain)
      chains.append(chain)
  return ([_episode(calls, chain, end_of_turn, eos, width) for chain in chains[::-1]],
          len(calls) - len(taken))


def episode_from_calls(calls: Sequence[serving.Call], end_of_turn: int, eos: int | None,
                       width: int) -> tuple[episode_lib.Episode, int]:
  """(the trajectory that ends at the last call, the calls outside it)."""
  samples, untrained = episode_samples(calls, end_of_turn, eos, width)
  return samples[0], untrained


COUNTS = ("agent_calls", "agent_samples", "agent_untrained_calls", "agent_errors",
          "agent_timeouts", "agent_no_calls")  # `AgentPlayer.tool_stats`


class AgentPlayer:
  """Plays batches of one agent source's episodes (see the module docstring); the same
  interface as `episodes.EpisodePlayer`.

  Args:
    source: the source (its `env` fields: `agent`, `agent_timeout_s`, `env_workers`,
      `max_turns` (calls per episode at most), `max_episode_tokens`, `on_env_error`).
    tokenizer: the policy's tokenizer (its chat template renders the calls).
    settings: the sampler's settings: every call samples at its temperature and top-p
      (whatever the program asks), at most `max_new_tokens` per call.
  """

  def __init__(self, source: Source, tokenizer, settings: sampling.SamplingSettings):
    self.fields, self.tokenizer = source.env, tokenizer
    self.run = load_agent(source.env["agent"], f"{source.field}.agent")
    self.renderer = envs.ChatRenderer(tokenizer)
    self.end_of_turn, self.eos = self.renderer.end_of_turn_id, tokenizer.eos_token_id
    self.settings = dataclasses.replace(sampling.turn_settings(settings, self.end_of_turn),
                                        num_samples=1)
    self.width = source.env["max_episode_tokens"]
    Q = settings.page_size
    self.layout = serving.Layout(slots=min(self.fields["env_workers"], 64),
                                 context=-(-(self.width + Q) // Q) * Q, page_size=Q,
                                 chunk_steps=8, top_logprobs=0,
                                 prefill_chunk=settings.prefill_chunk)
    self.name = f"agent {source.env['agent']!r}" + (f" of source {source.name!r}"
                                                    if source.name else "")
    self.server = self.engine = self.client = None
    self.version, self.counts = 0, {}
    self.loop = asyncio.new_event_loop()
    self.thread = threading.Thread(target=self.loop.run_forever, name="agents", daemon=True)
    self.thread.start()

  def _serve(self, model: models.Model) -> None:
    if self.engine is None:
      self.engine = serving.Engine(model, self.settings, self.layout,
                                   max_waiting=max(1024, 4 * self.fields["env_workers"]))
      backend = serving.Backend(self.engine, self.tokenizer, MODEL_NAME,
                                self.settings.max_new_tokens, fixed=self.settings,
                                episode_tokens=self.width, max_calls=self.fields["max_turns"])
      self.server = serving.Server(backend)
    self.version += 1
    self.engine.publish(model, self.version)

  def play(self, model: models.Model, records: Sequence[dict], indices: Sequence[int],
           key: jax.Array, rows: Sequence[int] | None = None) -> list[episode_lib.Episode]:
    """One episode per record (repeat a record for G episodes), as the trajectory of its
    last call; episode b's calls draw from fold_in(key, b), or fold_in(key, rows[b]) (its
    row in a batch spanning processes). `model`: on one device (`episodes.local_model`)."""
    return [samples[-1] for samples in self.play_samples(model, records, indices, key, 1, rows)]

  def play_samples(self, model: models.Model, records: Sequence[dict],
                   indices: Sequence[int], key: jax.Array, most: int,
                   rows: Sequence[int] | None = None) -> list[list[episode_lib.Episode]]:
    """`play`, each episode as up to `most` trajectories, oldest first (`episode_samples`);
    the last carries the reward."""
    self._serve(model)
    rows = range(len(records)) if rows is None else rows
    jobs = [(dict(r), int(i), _raw_key(jax.random.fold_in(key, b)), most)
            for b, r, i in zip(rows, records, indices)]
    return asyncio.run_coroutine_threadsafe(self._play_all(jobs), self.loop).result()

  async def _play_all(self, jobs) -> list[list[episode_lib.Episode]]:
    gate = asyncio.Semaphore(self.fields["env_workers"])

    async def one(job):
      async with gate:
        return await self._play_one(*job)
    return list(await asyncio.gather(*(one(job) for job in jobs)))

  async def _play_one(self, record: dict, index: int, key: np.ndarray, most: int
                      ) -> list[episode_lib.Episode]:
    import openai  # pylint: disable=g-import-not-at-top
    backend, scope = self.server.backend, uuid.uuid4().hex
    where = f"{self.name}, record {index}"
    backend.open_episode(scope, key)
    if self.client is None:  # one HTTP client (and SSL context) for every episode's
      self.client = openai.AsyncOpenAI(base_url=self.server.base_url, api_key="episode",
                                       max_retries=0, timeout=self.fields["agent_timeout_s"])
    client = self.client.copy(base_url=self.server.episode_url(scope))
    failed = None
    try:
      result = await asyncio.wait_for(self.run(client, record), self.fields["agent_timeout_s"])
      reward, info = _as_outcome(result, where)
    except asyncio.TimeoutError:
      failed = "agent_timeouts"
    except Exception as e:  # pylint: disable=broad-except
      if self.fields["on_env_error"] == "stop":
        raise envs.EnvError(f"{where}: the agent raised {type(e).__name__}: "
                            f"{' '.join(str(e).split())}") from e
      failed = "agent_errors"
    finally:
      log = backend.close_episode(scope)
    calls = log.calls
    self._count("agent_calls", len(calls))
    if failed is None and not calls:
      failed = "agent_no_calls"
    if failed is not None:
      self._count(failed)
      ep = episode_lib.Episode()
      ep.end("env_error")
      return [ep]
    samples, untrained = episode_samples(calls, self.end_of_turn, self.eos, self.width, most)
    ep = samples[-1]
    if log.ended is not None:  # a call past max_turns or max_episode_tokens ended it
      ep.ended = log.ended
    self._count("agent_samples", len(samples))
    self._count("agent_untrained_calls", untrained)
    ep.turn_rewards[-1], ep.turn_infos[-1] = reward, info
    return samples

  def _count(self, name: str, n: int = 1) -> None:
    self.counts[name] = self.counts.get(name, 0) + n

  def tool_stats(self) -> dict[str, int]:
    """The agents' counts since the last call (`env/agent_*`), every one of `COUNTS` (the
    same keys on every process, for the summary's collective)."""
    counts, self.counts = self.counts, {}
    return {name: counts.get(name, 0) for name in COUNTS}

  def close(self) -> None:
    if self.client is not None:
      asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result()
    if self.server is not None:
      self.server.close()
      self.engine.close()
    self.loop.call_soon_threadsafe(self.loop.stop)
    self.thread.join(timeout=10)


def _as_outcome(result, where: str) -> tuple[float, dict]:
  """An agent's return value as (reward, info)."""
  reward, info = result if isinstance(result, tuple) and len(result) == 2 else (result, {})
  if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
    raise envs.EnvError(f"{where}: the agent returned {result!r}: expected a finite reward "
                        "or (reward, info)")
  return float(reward), dict(info or {})
