"""Tool-using environments: Hermes/Qwen `<tool_call>` parsing, schemas, robust calls.

  def calc(expression: str) -> str:
    '''Evaluates an arithmetic expression.

    Args:
      expression: digits and + - * / ( ), e.g. "12*34".
    '''
    ...

  class CalcEnv(ToolEnv):
    tools = [calc]
    system_prompt = "Use the calculator."

The model calls a tool by writing, anywhere in its turn (several calls allowed):

  <tool_call>
  {"name": "calc", "arguments": {"expression": "12*34"}}
  </tool_call>

The default `step` runs each call and answers with one {"role": "tool", "content": text}
message per call, in order; a turn without calls ends the episode (`turn_outcome` is
the hook to change when an episode is done and what a turn earns). Every failure is
answered to the model as the tool message, and the episode goes on:

  bad_json       the text between the tags is not JSON, not {"name": str, "arguments":
                 {...}}, or a <tool_call> is never closed
  unknown_tool   no tool of that name
  bad_arguments  the arguments do not fit the function's signature
  raised         the tool raised: "error: <ExceptionType>: <message>"
  timeout        the tool ran past `tool_timeout_s` and was stopped

Each call is counted in `env.tool_stats` (`calls`, `ok` and the categories above), which
the trainer reads and resets per step with `take()`.

Tools run in a worker process (see `worker.py`) when the environment was built by
`load_environment`, so that a timeout really stops them. Tools must therefore be
functions of their arguments: they run on another instance of the environment in
another process, which may be killed; state across turns belongs in `step`. Call
`close()` (or use the environment as a context manager) to stop the worker; exit and
garbage collection stop it too.
"""
import dataclasses
import inspect
import json
import re
from typing import Any, Callable

from jaxrl_llm.envs import base
from jaxrl_llm.envs import worker

CATEGORIES = ("ok", "bad_json", "unknown_tool", "bad_arguments", "raised", "timeout")
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_CALL_FORMAT = '{"name": <tool name>, "arguments": {<argument>: <value>, ...}}'


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """A well-formed call: the tool's name, its arguments, the text between the tags."""
  name: str
  arguments: dict
  text: str = ""


@dataclasses.dataclass(frozen=True)
class ToolCallError:
  """A malformed call: its category (`bad_json`), what to tell the model, the text."""
  kind: str
  message: str
  text: str = ""


def _parse_one(body: str) -> ToolCall | ToolCallError:
  body = body.strip()
  try:
    value = json.loads(body)
  except json.JSONDecodeError as e:
    return ToolCallError("bad_json", f"error: the tool call is not valid JSON ({e.msg} at "
                         f"character {e.pos}); expected {_CALL_FORMAT}", body)
  if not isinstance(value, dict):
    return ToolCallError("bad_json", f"error: the tool call is a JSON {type(value).__name__}; "
                         f"expected an object {_CALL_FORMAT}", body)
  problems = []
  if not isinstance(value.get("name"), str):
    problems.append('no "name" string' if "name" not in value else '"name" is not a string')
  if not isinstance(value.get("arguments"), dict):
    problems.append('no "arguments" object' if "arguments" not in value
                    else '"arguments" is not an object')
  if problems:
    return ToolCallError("bad_json", f"error: the tool call has {' and '.join(problems)}; "
                         f"expected {_CALL_FORMAT}", body)
  return ToolCall(value["name"], value["arguments"], body)


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
  """The calls in a model turn, in order; whitespace around and inside the tags is free.

  A `<tool_call>` left open at the end (the turn was cut, or the model forgot the
  closing tag) is a `bad_json` error; a stray `</tool_call>` is ignored.
  """
  calls: list[ToolCall | ToolCallError] = []
  end = 0
  for match in _CALL.finditer(text):
    calls.append(_parse_one(match.group(1)))
    end = match.end()
  rest = text.find("<tool_call>", end)
  if rest >= 0:
    calls.append(ToolCallError("bad_json", "error: <tool_call> is not closed by </tool_call>",
                               text[rest + len("<tool_call>"):].strip()))
  return calls


@dataclasses.dataclass
class ToolStats:
  """Counts of tool calls by outcome; `calls` is their total."""
  calls: int = 0
  ok: int = 0
  bad_json: int = 0
  unknown_tool: int = 0
  bad_arguments: int = 0
  raised: int = 0
  timeout: int = 0

  def count(self, category: str) -> None:
    if category not in CATEGORIES:
      raise ValueError(f"Tool call category {category!r} is not one of {CATEGORIES}.")
    self.calls += 1
    setattr(self, category, getattr(self, category) + 1)

  def as_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)

  def reset(self) -> None:
    for field in dataclasses.fields(self):
      setattr(self, field.name, 0)

  def take(self) -> dict[str, int]:
    """The counts so far, then zero them (one trainer step's worth)."""
    counts = self.as_dict()
    self.reset()
    return counts


class ToolEnv(base.Environment):
  """An environment whose model calls `tools`; see the module docstring.

  Class attributes a subclass sets:
    tools: plain functions with type hints and a Google-style docstring (an `Args:`
      entry per argument): their schemas are shown to the model.
    system_prompt: the default `reset`'s system message; None for none.
    tool_timeout_s: a call's time limit in seconds (None: no limit); `env_args` may
      override it as `tool_timeout_s=`.
    max_result_chars: a tool message longer than this is cut (None: never).
  """
  tools: list[Callable[..., Any]] = []
  system_prompt: str | None = None
  tool_timeout_s: float | None = 10.0
  max_result_chars: int | None = None

  def __init__(self, tool_timeout_s: float | None = None, **env_args):
    super().__init__(**env_args)
    if tool_timeout_s is not None:
      if not tool_timeout_s > 0:
        raise ValueError(f"tool_timeout_s = {tool_timeout_s!r}; expected a positive number "
                         "of seconds (or None for no limit).")
      self.tool_timeout_s = float(tool_timeout_s)
    self.tool_stats = ToolStats()
    self._runner = None

  # -- the protocol ---------------------------------------------------------------------

  def reset(self, record: dict) -> list[dict]:
    """[system_prompt,] the record's "prompt" as the user message."""
    if not isinstance(record.get("prompt"), str):
      raise base.EnvError(f"{base.describe(self)}: the default reset() needs a str 'prompt' "
                          f"field; the record has {sorted(record)}. Override reset(record).")
    system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
    return system + [{"role": "user", "content": record["prompt"]}]

  def turn_outcome(self, messages: list[dict],
                   calls: list[ToolCall | ToolCallError]) -> tuple[bool, float]:
    """(done, reward) after the model's turn `messages[-1]` with its parsed `calls`.

    Default: done when the turn makes no call, reward 0 (outcome rewards belong to the
    trainer's reward functions, which see the whole episode). When done, the calls are
    not run.
    """
    del messages
    return not calls, 0.0

  def step(self, messages: list[dict]) -> base.StepResult:
    calls = parse_tool_calls(messages[-1]["content"])
    done, reward = self.turn_outcome(messages, calls)
    if done:
      return base.StepResult([], reward, True)
    return base.StepResult([{"role": "tool", "content": self.call_tool(c)} for c in calls],
                           reward, False)

  # -- tools ----------------------------------------------------------------------------

  def tool_functions(self) -> dict[str, Callable[..., Any]]:
    """The tools by name; their names must be distinct."""
    functions = {}
    for fn in self.tools:
      name = getattr(fn, "__name__", None)
      if not callable(fn) or not name or name == "<lambda>":
        raise base.EnvError(f"{base.describe(self)}: tool {fn!r} is not a named function; "
                            "expected functions defined with def.")
      if name in functions:
        raise base.EnvError(f"{base.describe(self)}: two tools are named {name!r}.")
      functions[name] = fn
    return functions

  def tool_schemas(self) -> list[dict]:
    """The JSON schemas of the tools, for `apply_chat_template(..., tools=schemas)`."""
    # Imported here: the worker process never needs transformers.
    from transformers.utils import chat_template_utils  # pylint: disable=g-import-not-at-top
    schemas = []
    for name, fn in self.tool_functions().items():
      try:
        schemas.append(chat_template_utils.get_json_schema(fn))
      except (chat_template_utils.DocstringParsingException,
              chat_template_utils.TypeHintParsingException) as e:
        raise base.EnvError(
            f"{base.describe(self)}: tool {name!r} has no JSON schema: {e}. A tool needs a "
            "type hint and an 'Args:' docstring entry for each argument.") from e
    return schemas

  def call_tool(self, call: ToolCall | ToolCallError) -> str:
    """Runs one parsed call; returns the tool message's text and counts its outcome."""
    category, text = self._call_tool(call)
    self.tool_stats.count(category)
    if self.max_result_chars is not None and len(text) > self.max_result_chars:
      text = text[:self.max_result_chars] + " ...[cut]"
    return text

  def _call_tool(self, call: ToolCall | ToolCallError) -> tuple[str, str]:
    if isinstance(call, ToolCallError):
      return call.kind, call.message
    functions = self.tool_functions()
    fn = functions.get(call.name)
    if fn is None:
      return "unknown_tool", (f"error: unknown tool {call.name!r}; the tools are "
                              f"{', '.join(functions) or 'none'}")
    try:
      inspect.signature(fn).bind(**call.arguments)
    except TypeError as e:
      return "bad_arguments", f"error: bad arguments for tool {call.name!r}: {e}"
    category, text = self._get_runner().call(call.name, call.arguments, self.tool_timeout_s)
    if category == worker.TIMEOUT:
      stopped = " and was stopped" if isinstance(self._runner, worker.ProcessRunner) else ""
      return "timeout", (f"error: tool {call.name!r} did not finish within "
                         f"{self.tool_timeout_s:g} s{stopped}")
    return category, text

  def _get_runner(self):
    if self._runner is None:
      self._runner = (worker.ProcessRunner(self.spec, self.env_args) if self.spec
                      else worker.ThreadRunner(self.tool_functions))
    return self._runner

  def close(self) -> None:
    """Stops the tool worker process, if one runs (a later call starts a new one)."""
    if self._runner is not None:
      self._runner.close()
      self._runner = None

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()
