"""Token-exact rendering of multi-turn conversations with a tokenizer's chat template.

The model's turns are never decoded and tokenized again: an episode's tokens are

  prompt_ids(opening messages)                      the template, generation prompt last
  + the model's sampled ids, ending with END        END: the end-of-turn token
  + suffix_ids(conversation, new messages)          what the template adds, up to and
  + the model's next sampled ids ...                including the next generation prompt

The suffix rule. After a model turn with text `content` (decoded without END), the text
the episode's tokens stand for is

  H = render(conversation[:-1], add_generation_prompt=True) + content + END

and the template's rendering of the longer conversation, ready for the next turn, is

  F = render(conversation + new_messages, add_generation_prompt=True).

The suffix is F[len(H):], tokenized on its own. F must start with H, else
`TemplateError`: the template rewrote earlier text, or does not put END right after an
assistant's content. For ChatML the suffix is "\\n<|im_start|>tool\\n...<|im_end|>\\n
<|im_start|>assistant\\n": the "\\n" the template writes after <|im_end|> is not sampled,
so it opens the suffix. By induction the episode's text is F after every environment
reply, so the next H is exact too. Only these boundaries need to be append-only:
Qwen2.5's template, which merges consecutive tool messages into one turn (so the
rendering after the first of two tool messages is not a prefix of the one after both),
is fine.

The probe. `check_template()` builds, as the trainer would, a conversation with a
system prompt, a turn with a <think> block and two tool calls, two tool replies, an
answer, a second user message and a last answer; it refuses (one-line TemplateError,
naming the tokenizer and the first differing character or token) a template whose
suffix rule fails at any boundary (e.g. Qwen3's, which rewrites earlier assistant
turns' <think> blocks), whose rendering of the whole conversation does not start with
what was built, or whose piecewise tokens differ from tokenizing the built text at once
(a tokenizer that merges across a turn boundary).
"""
from typing import Any

PROBE_TOOL_CALLS = ('<tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}'
                    '</tool_call> <tool_call>{"name": "calc", "arguments": '
                    '{"expression": "5+6"}}</tool_call>')
# Printable ASCII without newlines, so it also probes the character-level tokenizer.
PROBE_CONVERSATION = (
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What are 12*34 and 5+6?"},
    {"role": "assistant",
     "content": "<think>Both need the calculator.</think> " + PROBE_TOOL_CALLS},
    {"role": "tool", "content": "408"},
    {"role": "tool", "content": "11"},
    {"role": "assistant", "content": "12*34 = 408 and 5+6 = 11."},
    {"role": "user", "content": "Thanks! And 2+2?"},
    {"role": "assistant", "content": "2+2 = 4."},
)


class TemplateError(ValueError):
  """A chat template or tokenizer cannot render episodes token-exactly (one-line message)."""


def first_difference(a, b) -> int:
  """The first index where sequences `a` and `b` differ (the shorter's length if none)."""
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return min(len(a), len(b))


def _one_line(text: str) -> str:
  return " ".join(str(text).split())


class ChatRenderer:
  """Renders and tokenizes conversations for episodes; see the module docstring.

  Args:
    tokenizer: a transformers tokenizer with a chat template.
    tools: JSON schemas (`ToolEnv.tool_schemas()`), passed to every rendering.
    end_of_turn: the token that ends the model's turn; default the tokenizer's eos
      (`<|im_end|>` for Qwen instruct models, `<eos>` for the character tokenizer). It
      must encode to exactly one token.
  """

  def __init__(self, tokenizer, tools: list[dict] | None = None, *,
               end_of_turn: str | None = None):
    self.tokenizer = tokenizer
    self.tools = list(tools) if tools else None
    self.name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if not getattr(tokenizer, "chat_template", None):
      raise TemplateError(f"Tokenizer {self.name!r} has no chat template; set "
                          "tokenizer.chat_template (e.g. jaxrl_llm.envs.CHAR_TOOL_CHAT_TEMPLATE).")
    self.end_of_turn = end_of_turn if end_of_turn is not None else tokenizer.eos_token
    if not self.end_of_turn:
      raise TemplateError(f"Tokenizer {self.name!r} has no eos token to end the model's "
                          "turns; pass end_of_turn= (e.g. '<|im_end|>').")
    ids = self.encode(self.end_of_turn)
    if len(ids) != 1:
      raise TemplateError(f"Tokenizer {self.name!r}: the end-of-turn text {self.end_of_turn!r} "
                          f"encodes to {len(ids)} tokens {ids}; expected one (a special token).")
    self.end_of_turn_id = ids[0]

  # -- text and tokens ------------------------------------------------------------------

  def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
    kwargs: dict[str, Any] = {"tools": self.tools} if self.tools else {}
    try:
      return self.tokenizer.apply_chat_template(
          list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)
    except Exception as e:  # pylint: disable=broad-except
      roles = ", ".join(m.get("role", "?") for m in messages)
      raise TemplateError(f"Chat template of tokenizer {self.name!r} cannot render messages "
                          f"[{roles}]: {type(e).__name__}: {_one_line(e)}") from e

  def encode(self, text: str) -> list[int]:
    """`text`'s ids, nothing added (templates write their own special tokens)."""
    return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

  def decode_turn(self, ids: list[int]) -> str:
    """A model turn's text: its ids decoded verbatim, without the final end-of-turn token."""
    ids = list(ids)
    if ids and ids[-1] == self.end_of_turn_id:
      ids = ids[:-1]
    return self.tokenizer.decode(ids, skip_special_tokens=False,
                                 clean_up_tokenization_spaces=False)

  # -- episodes -------------------------------------------------------------------------

  def prompt_ids(self, messages: list[dict]) -> list[int]:
    """The opening messages rendered with the generation prompt, as ids."""
    return self.encode(self.render(messages, add_generation_prompt=True))

  def suffix_text(self, messages: list[dict], new_messages: list[dict]) -> str:
    """The text the template adds after the model's turn `messages[-1]` for `new_messages`,
    from just after END up to and including the next generation prompt."""
    last = messages[-1].get("role") if messages else None
    if last != "assistant":
      raise ValueError("suffix_text: the conversation must end with the model's turn "
                       f"(role 'assistant'), not {last!r}.")
    if not new_messages:
      raise ValueError("suffix_text: new_messages is empty; expected the environment's reply.")
    head = (self.render(messages[:-1], add_generation_prompt=True) + messages[-1]["content"]
            + self.end_of_turn)
    full = self.render(list(messages) + list(new_messages), add_generation_prompt=True)
    if not full.startswith(head):
      self._not_a_prefix(head, full, f"the conversation of {len(messages)} messages as the "
                         "trainer built it (last turn closed by the end-of-turn token)",
                         f"the rendering with {len(new_messages)} more message(s)")
    return full[len(head):]

  def suffix_ids(self, messages: list[dict], new_messages: list[dict]) -> list[int]:
    """`suffix_text` as ids: what to append to the episode after the model's turn."""
    return self.encode(self.suffix_text(messages, new_messages))

  def _not_a_prefix(self, short: str, long: str, what_short: str, what_long: str):
    i = first_difference(short, long)
    raise TemplateError(
        f"Chat template of tokenizer {self.name!r} is not append-only: {what_long} does not "
        f"start with {what_short}; first difference at character {i}: "
        f"{short[i:i + 40]!r} vs {long[i:i + 40]!r} (the template rewrites earlier turns, or "
        f"does not end an assistant turn with {self.end_of_turn!r} right after its content).")

  def check_template(self, conversation: tuple[dict, ...] = PROBE_CONVERSATION) -> None:
    """Raises TemplateError (one line) unless episodes render token-exactly; see above."""
    conversation = [dict(m) for m in conversation]
    opening = 0
    while conversation[opening]["role"] != "assistant":
      opening += 1
    ids = self.prompt_ids(conversation[:opening])
    text = self.render(conversation[:opening], add_generation_prompt=True)
    i = opening
    while i < len(conversation):
      content = conversation[i]["content"]
      ids += self.encode(content) + [self.end_of_turn_id]
      text += content + self.end_of_turn
      j = i + 1
      while j < len(conversation) and conversation[j]["role"] != "assistant":
        j += 1
      if j > i + 1:
        ids += self.suffix_ids(conversation[:i + 1], conversation[i + 1:j])
        text = self.render(conversation[:j], add_generation_prompt=True)
      i = j
    full = self.render(conversation, add_generation_prompt=False)
    if not full.startswith(text):
      self._not_a_prefix(text, full, "the conversation as the trainer built it",
                         f"the rendering of all {len(conversation)} probe messages")
    whole = self.encode(text)
    if whole != ids:
      k = first_difference(ids, whole)
      raise TemplateError(
          f"Tokenizer {self.name!r} tokenizes the probe conversation differently piecewise (as "
          f"the trainer builds it) than at once: first difference at token {k} of "
          f"{len(whole)}: {ids[k:k + 4]} vs {whole[k:k + 4]} "
          f"({self.tokenizer.decode(whole[k:k + 4])!r}).")
