"""Tokenizers, templates and environments the envs tests share (built locally, no hub)."""
import functools
import textwrap

from transformers import PreTrainedTokenizerFast

from jaxrl_llm import envs
from jaxrl_llm.data import char_tokenizer

# Qwen2.5-Instruct's template, shortened (same structure: tools in the system turn,
# consecutive tool messages merged into one user turn of <tool_response> blocks).
QWEN_LIKE_TEMPLATE = textwrap.dedent("""\
    {%- if tools %}
        {{- '<|im_start|>system\\n' }}
        {%- if messages[0]['role'] == 'system' %}
            {{- messages[0]['content'] }}
        {%- else %}
            {{- 'You are a helpful assistant.' }}
        {%- endif %}
        {{- "\\n\\n# Tools\\n\\n<tools>" }}
        {%- for tool in tools %}
            {{- "\\n" }}
            {{- tool | tojson }}
        {%- endfor %}
        {{- "\\n</tools>\\n\\nCall a function as <tool_call>\\n" }}
        {{- "{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n" }}
        {{- "</tool_call><|im_end|>\\n" }}
    {%- else %}
        {%- if messages[0]['role'] == 'system' %}
            {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
        {%- else %}
            {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
    {%- for message in messages %}
        {%- if (message.role == "user") or (message.role == "system" and not loop.first)
               or (message.role == "assistant") %}
            {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
        {%- elif message.role == "tool" %}
            {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
                {{- '<|im_start|>user' }}
            {%- endif %}
            {{- '\\n<tool_response>\\n' }}
            {{- message.content }}
            {{- '\\n</tool_response>' }}
            {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
                {{- '<|im_end|>\\n' }}
            {%- endif %}
        {%- endif %}
    {%- endfor %}
    {%- if add_generation_prompt %}
        {{- '<|im_start|>assistant\\n' }}
    {%- endif %}
    """)

# ChatML, except that earlier assistant turns lose their <think> block (as Qwen3's does).
THINK_STRIPPING_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# ChatML, except that only the last assistant turn keeps its content.
DROPPING_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\\n...<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# Turns ended by the special token, but the generation prompt ends in a space, which a
# byte-level BPE merges into the next word: piecewise tokens differ from whole ones.
SPACE_PROMPT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '<|im_end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")

_CORPUS = [
    "<|im_start|>system\nYou are a calculator agent.<|im_end|>\n",
    "<|im_start|>user\nWhat are 12*34 and 5+6? Thanks! And 2+2?<|im_end|>\n",
    '<tool_call>\n{"name": "calc", "arguments": {"expression": "12*34"}}\n</tool_call>',
    "<tool_response>\n408\n</tool_response> user: assistant: tool: the answer is",
    "The quick brown fox jumps over the lazy dog. <think>Both need the calculator.</think>",
]


@functools.lru_cache(maxsize=None)
def _bpe_tokenizer_json() -> str:
  # pylint: disable-next=g-import-not-at-top
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_CORPUS * 20, trainer)
  return tok.to_str()


def bpe_tokenizer(chat_template: str = QWEN_LIKE_TEMPLATE,
                  eos_token: str = "<|im_end|>") -> PreTrainedTokenizerFast:
  """A small byte-level BPE tokenizer with ChatML's special tokens, Qwen2.5-like."""
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_bpe_tokenizer_json()),
                                 eos_token=eos_token, pad_token="<|endoftext|>",
                                 additional_special_tokens=["<|im_start|>", "<|im_end|>"])
  fast.chat_template = chat_template
  return fast


def char_tokenizer_with_tools():
  return char_tokenizer.build_char_tokenizer(chat_template=envs.CHAR_TOOL_CHAT_TEMPLATE)


def calc(expression: str) -> str:
  """Evaluates an arithmetic expression.

  Args:
    expression: digits, + - * and parentheses, e.g. "12*34".
  """
  if set(expression) - set("0123456789+-*() "):
    raise ValueError(f"bad character in {expression!r}")
  return str(eval(expression))  # pylint: disable=eval-used


class CalcEnv(envs.ToolEnv):
  """The calculator agent: one tool; done when a turn makes no call."""
  tools = [calc]
  system_prompt = "You are a calculator agent."


def call(name: str, **arguments) -> str:
  """A Hermes tool call without newlines (the character tokenizer has none)."""
  import json  # pylint: disable=g-import-not-at-top
  return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
