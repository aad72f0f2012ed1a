"""The OpenAI wire format: what a request may hold (`ChatRequest`, `CompletionRequest`,
validated by pydantic, unknown fields refused) and how a sample is answered (`chat_choice`,
`completion_choice`, with the token ids of vLLM's extension: `prompt_token_ids` on the
response, `token_ids` on each choice).

Tool calls. The model writes calls in the Hermes / Qwen format
(`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, `envs.tools`). A turn whose
calls all parse is answered with OpenAI's `tool_calls` (arguments as a JSON string, ids
`call_<index>`) and the text outside the tags as `content` (None if empty); a turn with a
malformed call is answered as plain `content`, as vLLM's Hermes parser does.
"""
from __future__ import annotations

import json
from typing import Any, Literal

import pydantic

from jaxrl_llm.envs import tools as tools_lib

ROLES = ("system", "developer", "user", "assistant", "tool")


class _Strict(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(extra="forbid")


class _Sampling(_Strict):
  """The fields both endpoints share."""
  model: str
  n: int = pydantic.Field(1, ge=1, le=64)
  max_tokens: int | None = pydantic.Field(None, ge=1)
  temperature: float = pydantic.Field(1.0, ge=0.0, le=2.0)
  top_p: float = pydantic.Field(1.0, gt=0.0, le=1.0)
  stop: str | list[str] | None = None
  seed: int | None = None
  stream: bool = False
  stream_options: dict[str, Any] | None = None
  user: str | None = None

  def usage_in_stream(self) -> bool:
    return bool((self.stream_options or {}).get("include_usage"))

  def stops(self) -> list[str]:
    return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(_Sampling):
  """`POST /v1/chat/completions`."""
  messages: list[dict[str, Any]] = pydantic.Field(min_length=1)
  tools: list[dict[str, Any]] | None = None
  tool_choice: Literal["auto", "none"] | None = None
  parallel_tool_calls: bool | None = None
  max_completion_tokens: int | None = pydantic.Field(None, ge=1)
  logprobs: bool = False
  top_logprobs: int | None = pydantic.Field(None, ge=0, le=20)

  @pydantic.field_validator("messages")
  @classmethod
  def _messages(cls, messages):
    for i, m in enumerate(messages):
      if m.get("role") not in ROLES:
        raise ValueError(f"messages[{i}].role={m.get('role')!r}: expected one of {list(ROLES)}")
      content = m.get("content")
      if content is not None and not isinstance(content, (str, list)):
        raise ValueError(f"messages[{i}].content: expected a string or a list of text parts")
    return messages

  def budget(self) -> int | None:
    return self.max_completion_tokens or self.max_tokens

  def alternatives(self) -> int:
    return (self.top_logprobs or 0) if self.logprobs else 0


class CompletionRequest(_Sampling):
  """`POST /v1/completions` (text in, text out)."""
  prompt: str | list[int]
  logprobs: int | None = pydantic.Field(None, ge=0, le=20)
  echo: Literal[False] = False

  def budget(self) -> int | None:
    return self.max_tokens if self.max_tokens is not None else 16

  def alternatives(self) -> int:
    return self.logprobs or 0


def text_of(content) -> str:
  """A message's content as text (a list of parts: its text parts joined)."""
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def template_messages(messages: list[dict]) -> list[dict]:
  """Messages as chat templates read them: text content, and an assistant's tool calls with
  their arguments as objects (as `transformers` documents them)."""
  out = []
  for m in messages:
    msg = {"role": m["role"], "content": text_of(m.get("content"))}
    if m.get("tool_calls"):
      msg["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
    for key in ("tool_call_id", "name"):
      if m.get(key) is not None:
        msg[key] = m[key]
    out.append(msg)
  return out


def _template_call(call: dict) -> dict:
  function = dict(call.get("function") or {})
  arguments = function.get("arguments")
  if isinstance(arguments, str):
    try:
      function["arguments"] = json.loads(arguments)
    except json.JSONDecodeError:
      pass
  return {"type": "function", "function": function, **({"id": call["id"]} if "id" in call else {})}


def assistant_message(text: str) -> dict:
  """The answer's message: `tool_calls` parsed from the Hermes format (module docstring)."""
  calls = tools_lib.parse_tool_calls(text)
  if not calls or any(isinstance(c, tools_lib.ToolCallError) for c in calls):
    return {"role": "assistant", "content": text, "tool_calls": None}
  rest = tools_lib._CALL.sub("", text).strip()  # pylint: disable=protected-access
  return {"role": "assistant", "content": rest or None, "tool_calls": [
      {"id": f"call_{i}", "type": "function",
       "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
      for i, c in enumerate(calls)]}


def same_message(a: dict, b: dict) -> bool:
  """Whether two messages say the same (content as text; tool calls by name and arguments)."""
  calls = lambda m: [(c.get("function", {}).get("name"), _template_call(c)["function"].get(
      "arguments")) for c in (m.get("tool_calls") or [])]
  return (a.get("role") == b.get("role") and text_of(a.get("content")) == text_of(b.get("content"))
          and calls(a) == calls(b))


def _token_logprobs(tokenizer, ids, logprobs, top) -> list[dict]:
  piece = lambda t: tokenizer.decode([t], skip_special_tokens=False)
  entry = lambda t, lp: {"token": piece(t), "logprob": float(lp),
                         "bytes": list(piece(t).encode("utf-8"))}
  return [dict(entry(t, lp), top_logprobs=[entry(a, alp) for a, alp in (top[i] if top else [])])
          for i, (t, lp) in enumerate(zip(ids, logprobs))]


def chat_choice(index: int, message: dict, finish_reason: str, ids, logprobs, top,
                tokenizer, with_logprobs: bool) -> dict:
  if message.get("tool_calls") and finish_reason == "stop":
    finish_reason = "tool_calls"
  return {"index": index, "message": message, "finish_reason": finish_reason,
          "logprobs": {"content": _token_logprobs(tokenizer, ids, logprobs, top)}
          if with_logprobs else None, "token_ids": list(ids)}


def completion_choice(index: int, text: str, finish_reason: str, ids, logprobs, top,
                      tokenizer, with_logprobs: bool) -> dict:
  entries = _token_logprobs(tokenizer, ids, logprobs, top)
  offsets, at = [], 0
  for e in entries:
    offsets.append(at)
    at += len(e["token"])
  return {"index": index, "text": text, "finish_reason": finish_reason, "token_ids": list(ids),
          "logprobs": {"tokens": [e["token"] for e in entries],
                       "token_logprobs": [e["logprob"] for e in entries],
                       "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]}
                                        for e in entries], "text_offset": offsets}
          if with_logprobs else None}


def stream_chunks(response: dict, include_usage: bool) -> list[dict]:
  """A whole response as the chunks of a stream (`stream: true`): per choice its text (and
  tool calls) in one delta, then its finish reason; the usage last if asked. The answer is
  sampled whole before the first chunk is sent (the engine returns a completion at its
  end)."""
  chat = response["object"] == "chat.completion"
  head = {"id": response["id"], "object": "chat.completion.chunk" if chat else "text_completion",
          "created": response["created"], "model": response["model"]}
  chunks = [dict(head, prompt_token_ids=response["prompt_token_ids"], choices=[
      {"index": c["index"], "delta": {"role": "assistant", "content": ""},
       "finish_reason": None} for c in response["choices"]])] if chat else []
  for c in response["choices"]:
    if chat:
      message = c["message"]
      delta = {"content": message["content"]} if message["content"] else {}
      if message.get("tool_calls"):
        delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(message["tool_calls"])]
      body = {"index": c["index"], "delta": delta, "logprobs": c["logprobs"],
              "finish_reason": None}
      last = {"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"],
              "token_ids": c["token_ids"]}
    else:
      body = {"index": c["index"], "text": c["text"], "logprobs": c["logprobs"],
              "finish_reason": None}
      last = {"index": c["index"], "text": "", "finish_reason": c["finish_reason"],
              "token_ids": c["token_ids"]}
    chunks += [dict(head, choices=[body]), dict(head, choices=[last])]
  if include_usage:
    chunks.append(dict(head, choices=[], usage=response["usage"]))
  return chunks


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
  return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
          "total_tokens": prompt_tokens + completion_tokens}
