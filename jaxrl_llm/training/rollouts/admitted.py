"""Episodes admitted one at a time: each episode's next turn starts as soon as its own
environment has answered, never waiting for the slowest episode of the batch.

`AdmittedEpisodePlayer` plays a batch's episodes on the serving engine (`serving.Engine`:
continuous batching over a paged KV cache, on this process's first device). Every episode
is driven by a thread of its own: it resets its environment, submits its turn to the
engine, steps the environment with the answer, submits the next turn, and so on. The
engine decodes the turns of every episode that is waiting for the model together, and a
turn submitted while others decode joins them at the next chunk (`chunk_steps` tokens).
An episode is one engine session: its next turn continues its slot's keys and values, so
only the environment's reply is prefilled (`serving.engine`, "Sessions").

What is played is what `episodes.EpisodePlayer` plays (the same environments, rules,
endings, errors and token-exact record); only the order differs. Keys: turn j of episode b
draws its tokens from fold_in(fold_in(fold_in(key, b), j), t), t counting the turn's
tokens (the turn-synchronous player counts t over the whole episode instead), so an
episode's tokens depend on its key, its conversation and the weights, not on its
neighbours or on when its environment answered.

Which player plays a source's episodes: `config.sampling.engine` ('continuous', or 'auto'
on a CPU or GPU: this one; 'static', or 'auto' on a TPU: the turn-synchronous
`EpisodePlayer`; `sampling.engine_kind`).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import uuid
from typing import Callable, Sequence

import jax
import numpy as np

from jaxrl_llm import envs, models, sampling, serving
from jaxrl_llm.config.sources import Source
from jaxrl_llm.envs import episode as episode_lib
from jaxrl_llm.training.rollouts.episodes import EpisodePlayer

CHUNK_STEPS = 8  # decode steps per engine call: a waiting turn joins within this many


class Stale(Exception):
  """An episode's earlier turns are older than the staleness bound now allows."""


class AdmittedEpisodePlayer(EpisodePlayer):
  """Plays batches of one source's episodes, each at its own pace (module docstring); the
  interface of `episodes.EpisodePlayer`."""

  def __init__(self, source: Source, tokenizer, settings: sampling.SamplingSettings):
    super().__init__(source, tokenizer, settings)
    if settings.top_k:
      raise ValueError(f"sampling.top_k={settings.top_k}: episode-level admission samples "
                       "with temperature and top-p only: expected 0, or "
                       "config.sampling.engine='static' (turn-synchronous episodes)")
    self.settings = dataclasses.replace(self.settings, num_samples=1)
    Q, T = settings.page_size, self.fields["max_episode_tokens"]
    self.context = -(-(T + Q) // Q) * Q
    self.engine, self.version = None, 0

  def serve(self, model: models.Model, rows: int, version: int | None = None,
            after_running: bool = False) -> serving.Engine:
    """The engine over `model` (version `version`, else the next of this player's count),
    with a slot for each of `rows` episodes; `after_running`: published once the turns
    decoding have ended (`serving.Engine.publish`)."""
    if self.engine is not None and self.engine.layout.slots < rows:
      self.engine.close()
      self.engine = None
    if self.engine is None:
      layout = serving.Layout(slots=max(8, 1 << (rows - 1).bit_length()), context=self.context,
                              page_size=self.settings.page_size, chunk_steps=CHUNK_STEPS,
                              top_logprobs=0, prefill_chunk=self.settings.prefill_chunk)
      self.engine = serving.Engine(model, self.settings, layout, max_waiting=max(1024, rows))
    self.version = self.version + 1 if version is None else version
    self.engine.publish(model, self.version, after_running)
    return self.engine

  def play(self, model: models.Model, records: Sequence[dict], indices: Sequence[int],
           key: jax.Array, rows: Sequence[int] | None = None) -> list[episode_lib.Episode]:
    """One episode per record (repeat a record for G episodes), all ended. `model`: on one
    device (`episodes.local_model`); episode b draws from fold_in(key, b), or
    fold_in(key, rows[b]) (its row in a batch spanning processes)."""
    engine = self.serve(model, len(records))
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
    keys = np.asarray(sampling.numbered_keys(key, range(len(records)) if rows is None else rows))
    jobs = [(engine, dict(r), f"{self.name}, record {int(i)}", keys[b])
            for b, (r, i) in enumerate(zip(records, indices))]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as drivers:
      return list(drivers.map(lambda job: self.play_one(*job), jobs))

  def play_one(self, engine: serving.Engine, record: dict, where: str, key: np.ndarray,
               oldest: Callable[[], float] | None = None) -> episode_lib.Episode:
    """One episode from reset to its end (`envs.EnvError` with on_env_error 'stop');
    `oldest`: the oldest policy version its turns may come from now, checked before each
    turn (`Stale` if an earlier turn's is older: partial rollouts restart it)."""
    T, N = self.fields["max_episode_tokens"], self.settings.max_new_tokens
    ep = self._each_one(self._reset, (record, where))
    if ep is None:
      return _ended("env_error")
    if len(ep.tokens) >= T:
      raise envs.EnvError(f"{where}: the opening messages are {len(ep.tokens)} tokens, which "
                          f"leaves no room within {self.source.field}.max_episode_tokens={T}: "
                          "expected more")
    session = uuid.uuid4().hex
    try:
      for turn in range(1, self.fields["max_turns"] + 1):
        if oldest is not None and ep.turn_versions and min(ep.turn_versions) < oldest():
          raise Stale(f"{where}: turn 1 was sampled by version {min(ep.turn_versions)}")
        budget = min(N, T - len(ep.tokens))
        done = engine.submit(serving.Request(
            list(ep.tokens), budget, self.settings.temperature, self.settings.top_p,
            key=np.asarray(jax.random.fold_in(key, turn)), session=session)).result()
        ids = done.tokens
        ep.add_model_turn(ids, done.logprobs, self.renderer.decode_turn(ids))
        ep.turn_versions.append(done.policy_version)
        ep.routing = done.routing  # the whole episode's so far: it kept its slot's sequence
        if ids[-1] != self.end_of_turn:
          ep.end("eos" if ids[-1] == self.eos else
                 "max_new_tokens" if len(ids) == N else "max_episode_tokens")
          return ep
        result = self._each_one(self._step, ([dict(m) for m in ep.messages],
                                             f"{where}, turn {turn}"))
        if result is None:
          ep.end("env_error")
          return ep
        ep.turn_rewards[-1], ep.turn_infos[-1] = result.reward, result.info
        if result.done:
          ep.end("done")
        elif turn == self.fields["max_turns"]:
          ep.end("max_turns")
        else:  # ends it 'max_episode_tokens' if the reply leaves no room for another turn
          ep.add_env_messages(self.renderer, result.messages, T)
        if ep.ended is not None:
          return ep
    finally:
      engine.release(session)
    return ep

  def _each_one(self, fn, job):
    """`fn(env, job)` on an idle environment; None if it raised an EnvError and errors drop
    episodes."""
    try:
      return self._with_env(fn, job)
    except envs.EnvError:
      if self.fields["on_env_error"] == "stop":
        raise
      return None

  def close(self) -> None:
    if self.engine is not None:
      self.engine.close()
    super().close()


def _ended(why: str) -> episode_lib.Episode:
  ep = episode_lib.Episode()
  ep.end(why)
  return ep
