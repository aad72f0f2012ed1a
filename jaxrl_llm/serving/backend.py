"""What the endpoint does with a request: render, sample on the engine, answer, and, for an
episode's calls, keep the log the trainer assembles episodes from.

Episodes. A client scoped to an episode (`/episodes/ID/v1`, `Backend.open_episode`) has
every call logged (`Call`). A call whose messages are the previous call's, then the answer
it got (as the engine sampled it, ending with the end-of-turn token), then messages of
other roles (tool results, the user), continues that call's tokens: its prompt is the
previous prompt, the sampled completion and the chat template's suffix for the new messages
(`envs.ChatRenderer.suffix_ids`), never a re-rendering of earlier turns, so the calls form one
token-exact trajectory. Any other call (the agent edited its history, changed the tools, or
the template rewrites earlier turns) is rendered whole and starts a new trajectory.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading

import jax
import numpy as np

from jaxrl_llm import envs
from jaxrl_llm.sampling import choose
from jaxrl_llm.sampling.settings import SamplingSettings
from jaxrl_llm.serving import protocol
from jaxrl_llm.serving.engine import Completion, Engine, QueueFull, Request


class RequestError(Exception):
  """A request the endpoint refuses: its HTTP status, OpenAI error type and message."""

  def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
    super().__init__(message)
    self.status, self.kind = status, kind


@dataclasses.dataclass
class Choice:
  """One sampled answer: its tokens and behaviour log-probs, text and message; an MoE
  policy's `routing` (`Completion.routing`: the experts of its prompt and of its tokens but
  the last, as fed)."""
  tokens: list[int]
  logprobs: list[float]
  text: str
  message: dict
  finish_reason: str
  policy_version: int
  routing: np.ndarray | None = None


@dataclasses.dataclass
class Call:
  """One chat call of an episode: the messages and tools it rendered, its prompt ids, the
  call (and choice) whose prompt and completion its prompt extends (`extends`, or None:
  rendered whole) and the roles of the messages it added after that answer."""
  messages: list[dict]
  tools: list[dict] | None
  prompt_ids: list[int]
  choices: list[Choice]
  extends: tuple[int, int] | None = None
  added_roles: tuple[str, ...] = ()


@dataclasses.dataclass
class EpisodeLog:
  """An episode's calls, and why it was cut, if it was: `ended` 'max_turns' (a call after
  its `max_calls`) or 'max_episode_tokens' (a call whose prompt left no room), each
  answered with an empty message (finish reason 'length') and not logged."""
  key: np.ndarray
  calls: list[Call] = dataclasses.field(default_factory=list)
  ended: str | None = None


class Backend:
  """The endpoint's logic over an `Engine` (see the module docstring).

  Args:
    engine: the serving engine.
    tokenizer: the model's tokenizer (its chat template renders chat requests).
    model_name: the name requests must give as `model`.
    max_tokens: the default (and, with `fixed`, the most) new tokens of a request.
    fixed: sampling settings every request runs with instead of its own temperature and
      top-p (a trainer's: behaviour log-probs under the loss's temperature), or None.
    episode_tokens: the most tokens of an episode's call, prompt and completion (a
      trainer's row width), or 0 (the engine's context).
    max_calls: the most calls of an episode (0: any number); one more gets an empty answer
      and ends it (`EpisodeLog`), as does a call whose prompt fills `episode_tokens`.

  An episode's calls may name any `model` (the scope says which model serves them).
  """

  def __init__(self, engine: Engine, tokenizer, model_name: str, max_tokens: int,
               fixed: SamplingSettings | None = None, episode_tokens: int = 0,
               max_calls: int = 0):
    self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
    self.max_tokens, self.fixed, self.episode_tokens = max_tokens, fixed, episode_tokens
    self.max_calls = max_calls
    self._episodes: dict[str, EpisodeLog] = {}
    self._lock = threading.Lock()

  # -- episodes -------------------------------------------------------------------------

  def open_episode(self, episode: str, key: np.ndarray) -> None:
    """Starts logging `episode`'s calls; its call c's choice i draws from
    fold_in(fold_in(key, c), i)."""
    with self._lock:
      self._episodes[episode] = EpisodeLog(np.asarray(key))

  def close_episode(self, episode: str) -> EpisodeLog:
    """The episode's log (its calls in order); the endpoint forgets it."""
    self.engine.release(episode)
    with self._lock:
      return self._episodes.pop(episode)

  # -- requests -------------------------------------------------------------------------

  async def chat(self, request: protocol.ChatRequest, episode: str | None = None) -> dict:
    log = self._episode(episode)
    if log is None:
      self._check_model(request.model)
    elif self.max_calls and len(log.calls) >= self.max_calls:
      return self._cut(log, "max_turns", request)
    tools = request.tools if request.tool_choice != "none" else None
    renderer = self._renderer(tools)
    messages = protocol.template_messages(request.messages)
    extends, added, prompt = None, (), None
    if log is not None and log.calls:
      found = _continuation(log.calls, messages, tools, renderer)
      if found is not None:
        prompt, extends, added = found
    if prompt is None:
      try:
        prompt = renderer.prompt_ids(messages)
      except envs.TemplateError as e:
        raise RequestError(400, str(e)) from e
    if log is not None and self.episode_tokens and len(prompt) >= self.episode_tokens:
      return self._cut(log, "max_episode_tokens", request)
    keys = self._keys(log, request, request.n)
    samples = await self._sample(prompt, request, keys, episode)
    choices = []
    for c in samples:
      text = renderer.decode_turn(c.tokens)
      choices.append(Choice(c.tokens, c.logprobs, text, protocol.assistant_message(
          _before_stop(text, request.stops())), c.finish_reason, c.policy_version, c.routing))
    if log is not None:
      with self._lock:
        log.calls.append(Call(messages, tools, list(prompt), choices, extends, added))
    return {"id": f"chatcmpl-{np.random.randint(1 << 62):x}", "object": "chat.completion",
            "created": 0, "model": self.model_name, "prompt_token_ids": list(prompt),
            "choices": [protocol.chat_choice(i, ch.message, ch.finish_reason, ch.tokens,
                                             ch.logprobs, s.top_logprobs, self.tokenizer,
                                             request.logprobs)
                        for i, (ch, s) in enumerate(zip(choices, samples))],
            "usage": protocol.usage(len(prompt), sum(len(ch.tokens) for ch in choices))}

  async def complete(self, request: protocol.CompletionRequest) -> dict:
    self._check_model(request.model)
    prompt = (list(request.prompt) if isinstance(request.prompt, list)
              else list(self.tokenizer.encode(request.prompt, add_special_tokens=False)))
    samples = await self._sample(prompt, request, self._keys(None, request, request.n), None)
    choices = [protocol.completion_choice(
        i, _before_stop(self.tokenizer.decode(s.tokens, skip_special_tokens=True),
                        request.stops()), s.finish_reason, s.tokens,
        s.logprobs, s.top_logprobs, self.tokenizer, request.logprobs is not None)
               for i, s in enumerate(samples)]
    return {"id": f"cmpl-{np.random.randint(1 << 62):x}", "object": "text_completion",
            "created": 0, "model": self.model_name, "prompt_token_ids": prompt,
            "choices": choices,
            "usage": protocol.usage(len(prompt), sum(len(s.tokens) for s in samples))}

  def _cut(self, log: EpisodeLog, why: str, request) -> dict:
    """An episode's call past its limits (`EpisodeLog`): an empty answer, not logged."""
    log.ended = why
    empty = {"role": "assistant", "content": "", "tool_calls": None}
    return {"id": "chatcmpl-cut", "object": "chat.completion", "created": 0,
            "model": self.model_name, "prompt_token_ids": [],
            "choices": [protocol.chat_choice(i, empty, "length", [], [], None, self.tokenizer,
                                             request.logprobs) for i in range(request.n)],
            "usage": protocol.usage(0, 0)}

  def _check_model(self, name: str) -> None:
    if name != self.model_name:
      raise RequestError(404, f"model={name!r}: this server serves {self.model_name!r}",
                         "model_not_found")

  def _episode(self, episode: str | None) -> EpisodeLog | None:
    if episode is None:
      return None
    with self._lock:
      log = self._episodes.get(episode)
    if log is None:
      raise RequestError(404, f"episode {episode!r} is not open")
    return log

  def _renderer(self, tools) -> envs.ChatRenderer:
    try:
      return envs.ChatRenderer(self.tokenizer, tools)
    except envs.TemplateError as e:
      raise RequestError(400, str(e)) from e

  def _keys(self, log: EpisodeLog | None, request, n: int) -> list[np.ndarray]:
    """The keys of a call's n choices: fold_in(fold_in(episode key, call), i) in an
    episode, else fold_in(PRNGKey(seed), i) (a random seed without one)."""
    if log is not None:
      keys = _episode_keys(log.key, len(log.calls), n)
    else:
      seed = request.seed if request.seed is not None else np.random.randint(1 << 31)
      keys = _seed_keys(seed, n)
    return list(np.asarray(keys))

  async def _sample(self, prompt: list[int], request, keys, episode: str | None
                    ) -> list[Completion]:
    """The request's n samples, cut at its stop strings. An episode's calls are one engine
    session: a call that continues the previous one reuses its keys and values."""
    limit = self.episode_tokens if episode is not None and self.episode_tokens else 0
    budget = request.budget() or self.max_tokens
    if self.fixed is not None:
      budget = min(budget, self.fixed.max_new_tokens)
    if limit:  # an episode's prompt leaves room: `chat` cuts the episode before it fills
      budget = min(budget, limit - len(prompt))
    temperature = self.fixed.temperature if self.fixed is not None else request.temperature
    top_p = self.fixed.top_p if self.fixed is not None else request.top_p
    engine_requests = [Request(prompt, budget, temperature, top_p, key=k,
                               top_logprobs=request.alternatives(), session=episode)
                       for k in keys]
    try:
      for r in engine_requests:
        self.engine.check(r)
      futures = [asyncio.wrap_future(self.engine.submit(r)) for r in engine_requests]
    except QueueFull as e:
      raise RequestError(429, str(e), "rate_limit_exceeded") from e
    except ValueError as e:
      raise RequestError(400, str(e), "context_length_exceeded" if "context" in str(e)
                         else "invalid_request_error") from e
    samples = await asyncio.gather(*futures)
    return [_cut_at_stop(self.tokenizer, s, request.stops()) for s in samples]


@functools.partial(jax.jit, static_argnums=(2,))
def _episode_keys(key, call, n: int):
  return choose.request_keys(jax.random.fold_in(key, call), n)


@functools.partial(jax.jit, static_argnums=(1,))
def _seed_keys(seed, n: int):
  return choose.request_keys(jax.random.PRNGKey(seed), n)


def _continuation(calls: list[Call], messages: list[dict], tools, renderer):
  """(prompt ids, (call, choice) extended, added roles) if `messages` continue the last
  call's answer (module docstring), else None."""
  last = calls[-1]
  k = len(last.messages)
  if tools != last.tools or len(messages) <= k + 1 or messages[:k] != last.messages:
    return None
  added = messages[k + 1:]
  if any(m["role"] == "assistant" for m in added):
    return None
  for j, choice in enumerate(last.choices):
    if not protocol.same_message(messages[k], choice.message):
      continue
    if not choice.tokens or choice.tokens[-1] != renderer.end_of_turn_id:
      return None
    history = last.messages + [{"role": "assistant", "content": choice.text}]
    try:
      suffix = renderer.suffix_ids(history, added)
    except (envs.TemplateError, ValueError):
      return None
    return (last.prompt_ids + choice.tokens + suffix, (len(calls) - 1, j),
            tuple(m["role"] for m in added))
  return None


def _before_stop(text: str, stops: list[str]) -> str:
  """`text` up to the first of `stops` (which OpenAI's answers leave out)."""
  at = [text.find(s) for s in stops if s in text]
  return text[:min(at)] if at else text


def _cut_at_stop(tokenizer, sample: Completion, stops: list[str]) -> Completion:
  """`sample` up to the first token whose text completes one of `stops` ('stop')."""
  if not stops:
    return sample
  text = tokenizer.decode(sample.tokens, skip_special_tokens=False)
  if not any(s in text for s in stops):
    return sample
  for n in range(1, len(sample.tokens) + 1):
    if any(s in tokenizer.decode(sample.tokens[:n], skip_special_tokens=False) for s in stops):
      top = sample.top_logprobs[:n] if sample.top_logprobs is not None else None
      routing = (None if sample.routing is None else  # its fed tokens: all but the last kept
                 sample.routing[:len(sample.routing) - (len(sample.tokens) - n)])
      return dataclasses.replace(sample, tokens=sample.tokens[:n], logprobs=sample.logprobs[:n],
                                 top_logprobs=top, finish_reason="stop", routing=routing)
  return sample


def load_backend(model_dir: str, layout, *, config=None, name: str | None = None,
                 max_tokens: int = 512, max_waiting: int = 256) -> Backend:
  """A backend over a new engine for the Hugging Face directory `model_dir` (`config`: a
  run's config, for `model.dtype` and the decode layout of `sampling`)."""
  import os  # pylint: disable=g-import-not-at-top
  from jaxrl_llm import data, models, sampling  # pylint: disable=g-import-not-at-top
  dtype = config.model.dtype if config is not None else "float32"
  model = models.from_pretrained(model_dir, dtype)
  tokenizer = data.load_tokenizer(model_dir)
  eos, pad = sampling.eos_ids(tokenizer, model.config), sampling.pad_id(tokenizer)
  if config is not None:
    settings = sampling.settings.from_config(config.sampling, eos, pad)
    settings = dataclasses.replace(settings, num_samples=1, max_new_tokens=layout.context,
                                   page_size=layout.page_size)
  else:
    settings = SamplingSettings(1, layout.context, eos_ids=eos, pad_id=pad,
                                page_size=layout.page_size)
  engine = Engine(model, settings, layout, max_waiting)
  return Backend(engine, tokenizer, name or os.path.basename(os.path.normpath(model_dir)),
                 max_tokens)
