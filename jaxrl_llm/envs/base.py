"""The environment protocol: `reset` opens a conversation, `step` answers each model turn.

A user's environment is a class, named in a config by import path
('path/to/my_env.py:MyEnv' or 'my_pkg.envs:MyEnv') and built by `load_environment`
with the config's `env_args`:

  class MyEnv(Environment):
    def reset(self, record):             # one dataset record -> the opening messages
      return [{"role": "user", "content": record["prompt"]}]
    def step(self, messages):            # the conversation so far; the last message is
      return [{"role": "user", "content": "Are you sure?"}], 0.0, False   # the model's

`step` returns a `StepResult` or a plain tuple `(new_messages, reward, done)`. Whatever
the user returns is checked here (`as_messages`, `as_step_result`) so that a mistake stops
with a message naming the environment, the record and the turn (`where`), the value and
what was expected, not with a KeyError deep in the renderer. Exceptions raised by the
user's own `reset`/`step` are wrapped the same way by `call_env` (the original is the
`__cause__`); nothing here swallows them: the trainer decides to stop or drop the episode.

Nothing in `jaxrl_llm.envs` imports jax or transformers at import time: the tool worker
process (`worker.py`) imports this package, and its start-up must stay cheap.
"""
import dataclasses
import math
import numbers
import os
from typing import Any

from jaxrl_llm import import_path


class EnvError(ValueError):
  """An environment misbehaved; the message names where (environment, record, turn)."""


@dataclasses.dataclass
class StepResult:
  """What `Environment.step` returns after a model turn.

  Attributes:
    messages: the new messages to append (roles such as "tool" or "user"); empty only
      when `done`.
    reward: this turn's reward from the environment (outcome rewards of the whole
      episode belong to the trainer's reward functions).
    done: the episode is over; `messages` are then not shown to the model.
    info: anything the environment wants logged; not interpreted.
  """
  messages: list[dict]
  reward: float = 0.0
  done: bool = False
  info: dict = dataclasses.field(default_factory=dict)


class Environment:
  """Base class of user environments; subclass it and define `reset` and `step`.

  `load_environment` records `spec` (its import path, a file path made absolute) and
  `env_args` (the keyword arguments it was built with) on the instance, so that a tool
  worker process can build the same environment again; both stay None / {} for an
  instance built directly.
  """

  def __init__(self, **env_args):
    self.env_args = dict(env_args)
    self.spec: str | None = None

  def reset(self, record: dict) -> list[dict]:
    """The opening chat messages for one dataset record."""
    raise NotImplementedError(f"{type(self).__name__} must define reset(record).")

  def step(self, messages: list[dict]) -> "StepResult | tuple":
    """The environment's answer to the model's turn `messages[-1]`."""
    raise NotImplementedError(f"{type(self).__name__} must define step(messages).")


def _short(value: Any, limit: int = 160) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


def as_messages(value: Any, where: str, what: str = "reset()", *,
                allow_empty: bool = False) -> list[dict]:
  """Checks `value` is a list of {'role': str, 'content': str} dicts; returns copies.

  Extra keys in a message are kept (templates may read them).
  """
  expected = "a list of messages {'role': str, 'content': str}"
  if not isinstance(value, (list, tuple)):
    raise EnvError(f"{where}: {what} returned {type(value).__name__} {_short(value)}; "
                   f"expected {expected}.")
  if not value and not allow_empty:
    raise EnvError(f"{where}: {what} returned no messages; expected {expected}, at least one.")
  messages = []
  for i, message in enumerate(value):
    if not isinstance(message, dict):
      raise EnvError(f"{where}: {what} returned message {i} = {_short(message)} of type "
                     f"{type(message).__name__}; expected a dict {{'role': str, 'content': str}}.")
    for key in ("role", "content"):
      if not isinstance(message.get(key), str):
        got = "no " + repr(key) if key not in message else (
            f"{key!r} = {_short(message[key])} ({type(message[key]).__name__})")
        raise EnvError(f"{where}: {what} returned message {i} with {got}; "
                       f"expected {key!r} to be a str.")
    messages.append(dict(message))
  return messages


def _as_done(done: Any, where: str) -> bool:
  # bool, 0/1 ints, and numpy's bool (neither int nor bool, so checked by name).
  if isinstance(done, numbers.Integral) and done in (0, 1):
    return bool(done)
  if type(done).__module__ == "numpy" and type(done).__name__ in ("bool", "bool_"):
    return bool(done)
  raise EnvError(f"{where}: step() returned done = {_short(done)} ({type(done).__name__}); "
                 "expected a bool.")


def as_step_result(value: Any, where: str) -> StepResult:
  """A checked `StepResult` from what `step` returned: a StepResult or (messages, reward, done).

  Refused: a tuple of another length, messages that are not a list of role/content
  dicts, a new message with role 'assistant' (the model's turns are sampled, never
  written by the environment), a reward that is not a finite number, a `done` that is
  not a bool, an `info` that is not a dict, and no new messages while not done (the
  conversation could not go on).
  """
  if isinstance(value, StepResult):
    messages, reward, done, info = value.messages, value.reward, value.done, value.info
  elif isinstance(value, tuple) and len(value) == 3:
    (messages, reward, done), info = value, {}
  else:
    got = (f"a tuple of {len(value)} items" if isinstance(value, tuple)
           else type(value).__name__)
    raise EnvError(f"{where}: step() returned {got} {_short(value)}; expected a StepResult "
                   "or a tuple (new_messages, reward, done).")
  messages = as_messages(messages, where, "step()", allow_empty=True)
  for i, message in enumerate(messages):
    if message["role"] == "assistant":
      raise EnvError(f"{where}: step() returned message {i} with role 'assistant'; expected "
                     "the environment's roles ('tool', 'user', ...): assistant turns are sampled.")
  if (isinstance(reward, bool) or not isinstance(reward, numbers.Real)
      or not math.isfinite(float(reward))):
    raise EnvError(f"{where}: step() returned reward = {_short(reward)} "
                   f"({type(reward).__name__}); expected a finite number.")
  done = _as_done(done, where)
  if not isinstance(info, dict):
    raise EnvError(f"{where}: step() returned info = {_short(info)}; expected a dict.")
  if not messages and not done:
    raise EnvError(f"{where}: step() returned no new messages and done = False; expected "
                   "messages for the model's next turn, or done = True.")
  return StepResult(messages, float(reward), done, dict(info))


def call_env(env: Environment, method: str, *args, where: str) -> Any:
  """`env.<method>(*args)`, with any exception re-raised as an EnvError naming `where`."""
  try:
    return getattr(env, method)(*args)
  except Exception as e:  # pylint: disable=broad-except
    raise EnvError(f"{where}: {method}() raised {type(e).__name__}: {e}") from e


def _absolute_spec(spec: str) -> str:
  """`spec` with a file path made absolute, so that it means the same from any directory."""
  where, sep, attr = spec.rpartition(":")
  if sep and where and import_path._is_file(where):  # pylint: disable=protected-access
    return os.path.abspath(os.path.expanduser(where)) + ":" + attr
  return spec


def load_environment(spec: str, env_args: dict | None = None) -> Environment:
  """Builds the environment that `spec` names, with keyword arguments `env_args`.

  Args:
    spec: 'path/to/env.py:MyEnv' or 'pkg.module:MyEnv' (see `jaxrl_llm.import_path`): a
      class (or any callable) whose instances have `reset` and `step`.
    env_args: keyword arguments for it; None means none.

  Returns:
    The instance, with `spec` (a file path made absolute) and `env_args` recorded on it.

  Raises:
    EnvError: naming `spec`, if it cannot be imported, built, or lacks reset/step.
  """
  env_args = dict(env_args or {})
  try:
    factory = import_path.load_function(spec)
  except Exception as e:  # pylint: disable=broad-except
    raise EnvError(f"Environment {spec!r} cannot be loaded: {type(e).__name__}: {e}") from e
  try:
    env = factory(**env_args)
  except Exception as e:  # pylint: disable=broad-except
    raise EnvError(f"Environment {spec!r}: building it with env_args {_short(env_args)} raised "
                   f"{type(e).__name__}: {e}") from e
  for method in ("reset", "step"):
    if not callable(getattr(env, method, None)):
      raise EnvError(f"Environment {spec!r} built a {type(env).__name__}, which has no "
                     f"{method}() method; expected a class with reset(record) and "
                     "step(messages), e.g. a jaxrl_llm.envs.Environment subclass.")
  try:
    env.spec, env.env_args = _absolute_spec(spec), env_args
  except AttributeError:  # __slots__ or a read-only property: it just cannot use a worker
    pass
  return env


def describe(env: Any) -> str:
  """'ClassName (spec)' for messages."""
  spec = getattr(env, "spec", None)
  return type(env).__name__ + (f" ({spec})" if spec else "")
