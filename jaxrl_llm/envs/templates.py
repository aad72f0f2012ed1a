"""Chat templates for multi-turn episodes with tools.

`CHAR_TOOL_CHAT_TEMPLATE` is ChatML-like and fits the character-level tokenizer
(`jaxrl_llm.data.char_tokenizer`, printable ASCII only: it encodes anything else, a
newline included, as <unk>). So: no newlines; one role letter and ':' open a turn (S
system, U user, A assistant, T tool), the tokenizer's eos token (`<eos>`, one token)
ends it, and a space separates turns. With tools, their JSON schemas (ASCII-escaped) go
into the system turn with how to call them:

  S:You compute. Tools: {"type": "function", ...} Call a tool as <tool_call>{"name":
  ..., "arguments": {...}}</tool_call><eos> U:What is 12*34?<eos> A:<tool_call>{"name":
  "calc", "arguments": {"expression": "12*34"}}</tool_call><eos> T:408<eos> A:

(one line; wrapped here). The model's turn ends with `<eos>`; what the environment adds
after it starts with the separating space (" T:408<eos> A:"). Earlier turns are never
rewritten, so `ChatRenderer.check_template` accepts it:

  tokenizer = build_char_tokenizer(chat_template=CHAR_TOOL_CHAT_TEMPLATE)

`CHAR_TOOL_NAMES_TEMPLATE` shows only the tools' names: "S:Tools: calc<eos> U:47*83<eos> A:".
"""

def _char_template(tools_text: str) -> str:
  return (
      "{% if messages[0]['role'] == 'system' %}"
      "{% set system = messages[0]['content'] %}{% set turns = messages[1:] %}"
      "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
      "{% if system or tools %}"
      "S:{{ system }}"
      "{% if tools %}{% if system %} {% endif %}Tools:" + tools_text + "{% endif %}"
      "{{ eos_token }}"
      "{% endif %}"
      "{% for message in turns %}"
      "{% if system or tools or not loop.first %} {% endif %}"
      "{{ message['role'][0] | upper }}:{{ message['content'] }}{{ eos_token }}"
      "{% endfor %}"
      "{% if add_generation_prompt %} A:{% endif %}")


CHAR_TOOL_CHAT_TEMPLATE = _char_template(
    "{% for tool in tools %} {{ tool | tojson(ensure_ascii=True) }}{% endfor %}"
    " Call a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>")

# The same with only the tools' names ("S:Tools: calc<eos> U:47*83<eos> A:"), for a tiny
# model that learns the calls from demonstrations (the calculator task's warm start).
CHAR_TOOL_NAMES_TEMPLATE = _char_template("{% for tool in tools %} {{ tool.function.name }}"
                                          "{% endfor %}")
