"""The calculator task as an agent program: a plain OpenAI-client tool loop.

  config.data.agent = "jaxrl_llm.envs.calculator_agent:run"   (configs/grpo_calculator_agent.py)

It imports nothing from jaxrl_llm and would run against any OpenAI-compatible server: it
sends the problem with the `calc` tool's schema, runs the calls the answer makes, sends
their results back as `tool` messages, and stops at an answer without a call (or after
`MAX_CALLS` calls). Its reward is exact match: the answer's first line is the product.
It plays what `jaxrl_llm.envs.calculator:CalculatorEnv` plays, with the same tool replies
and errors, but for a malformed `<tool_call>` (which the server answers as plain text, as
vLLM's parser does): the environment answers it with an error, this program takes it as
the final answer (README, "Agents", has both curves).
"""
import ast
import fractions
import json
import operator
import re

MAX_CALLS = 3  # the built-in environment's max_turns
CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluates an arithmetic expression of integers.",
    "parameters": {"type": "object", "properties": {"expression": {
        "type": "string", "description": "digits and + - * / ( ), e.g. \"47*83\"."}},
                   "required": ["expression"]},
    "return": {"type": "string"}}}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}


def _evaluate(node):
  if isinstance(node, ast.Constant) and type(node.value) is int:
    return fractions.Fraction(node.value)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    return -_evaluate(node.operand)
  if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
    return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
  raise ValueError(f"unsupported expression: {ast.dump(node)[:40]}")


def calc(expression: str) -> str:
  """Evaluates an arithmetic expression of integers (digits, + - * / and parentheses)."""
  value = _evaluate(ast.parse(expression, mode="eval").body)
  return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


def tool_reply(call) -> str:
  """The `tool` message for one call, as the built-in environment answers it."""
  if call.function.name != "calc":
    return f"error: unknown tool {call.function.name!r}; the tools are calc"
  try:
    arguments = json.loads(call.function.arguments)
    return calc(**arguments)
  except TypeError as e:
    return f"error: bad arguments for tool 'calc': {e}"
  except Exception as e:  # pylint: disable=broad-except
    return f"error: {type(e).__name__}: {e}"


async def run(client, record: dict) -> float:
  """Plays one problem (`record`: {'prompt': '47*83', 'answer': 3901}); returns 1.0 if the
  final answer is the product, else 0.0."""
  messages = [{"role": "user", "content": record["prompt"]}]
  for _ in range(MAX_CALLS):
    response = await client.chat.completions.create(model="policy", messages=messages,
                                                    tools=[CALC])
    choice = response.choices[0]
    message = choice.message
    messages.append(message.model_dump(exclude_none=True))
    if choice.finish_reason == "length":
      break
    if not message.tool_calls:  # an answer (or a call the server could not parse)
      break
    for call in message.tool_calls:
      messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_reply(call)})
  answer = (messages[-1].get("content") or "") if messages[-1]["role"] == "assistant" else ""
  line = answer.partition("\n")[0].strip()
  return float(re.fullmatch(r"-?\d+", line) is not None and int(line) == int(record["answer"]))
