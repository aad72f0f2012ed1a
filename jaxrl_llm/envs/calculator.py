"""The built-in agent task's environment: a calculator tool (`task:calculator`).

  config.data.env = "jaxrl_llm.envs.calculator:CalculatorEnv"

The model is asked for a product it cannot work out in its head ('47*83') and may call
`calc` in the Hermes format; the tool's answer comes back as a tool message, and a turn
without a call ends the episode (its text is the answer the reward functions check).
"""
from jaxrl_llm.envs import tools
from jaxrl_llm.rewards import expression as expression_lib


def calc(expression: str) -> str:
  """Evaluates an arithmetic expression of integers.

  Args:
    expression: digits and + - * / ( ), e.g. "47*83".
  """
  value = expression_lib.evaluate(expression, unary_minus=True).value
  return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


class CalculatorEnv(tools.ToolEnv):
  """One user message (the record's prompt, e.g. '47*83'); the tool `calc`."""
  tools = [calc]
  tool_timeout_s = 5.0
