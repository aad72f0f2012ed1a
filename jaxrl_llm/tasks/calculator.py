"""`task:calculator`: a product of two numbers, with a calculator tool (an agent task).

  record      {'prompt': '47*83', 'answer': 3901}
  episode     S:Tools: calc<eos> U:47*83<eos> A:<tool_call>{"name": "calc", "arguments":
              {"expression": "47*83"}}</tool_call><eos> T:3901<eos> A:3901<eos>

Operands are integers in [min_value, max_value] (default 10..99): products a tiny model
cannot work out in its head, but can copy from the tool
(`jaxrl_llm.envs.calculator:CalculatorEnv`, whose turn without a call ends the episode).
The reward functions score the last model turn: `calculator_exact` (the answer) and
`calculator_valid_call` (weight 0: the valid-call rate, logged).

A sloppy teacher for SFT (the agent demo's warm start, configs/sft_calculator.py): its
demonstration is the conversation after the opening. With probability `teacher_skip_tool`
it answers at once, without the tool; else it calls the tool, naming it 'calculator'
(an unknown tool: the error comes back) with probability `teacher_wrong_name` among its
calls, after which it answers without the tool; otherwise it calls `calc` and copies the
result. Its unaided answers are the true products (which a tiny model cannot learn to
compute), so a model that imitates it answers right only when it calls `calc`, and the
tool's name is a coin flip it learned: RL with the exact-match reward can settle it.
"""
import functools
import json
import random
from typing import Sequence

from jaxrl_llm.envs import calculator as calculator_env
from jaxrl_llm.tasks import base

ENV = "jaxrl_llm.envs.calculator:CalculatorEnv"


def make_problem(rng: random.Random, *, min_value: int = 10, max_value: int = 99) -> dict:
  a, b = rng.randint(min_value, max_value), rng.randint(min_value, max_value)
  return {"prompt": f"{a}*{b}", "answer": a * b}


def load_split(split: str, *, seed: int = 0, num_train: int = 100_000, num_eval: int = 256,
               min_value: int = 10, max_value: int = 99, teacher_skip_tool: float = 0.0,
               teacher_wrong_name: float = 0.0) -> Sequence[dict]:
  """The 'train' or 'eval' split (see `tasks.base`); the teacher options are checked here
  and read only by `demonstration`."""
  if not 0 <= min_value <= max_value:
    raise ValueError(f"calculator: need 0 <= min_value <= max_value, got {min_value}, "
                     f"{max_value}.")
  for name, p in (("teacher_skip_tool", teacher_skip_tool),
                  ("teacher_wrong_name", teacher_wrong_name)):
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"calculator: {name} is a probability in [0, 1], got {p!r}.")
  make = functools.partial(make_problem, min_value=min_value, max_value=max_value)
  return base.make_split(make, task="calculator", split=split, seed=seed, num_train=num_train,
                         num_eval=num_eval)


def tool_call(name: str, expression: str) -> str:
  """A call in the Hermes format, as the teacher writes it."""
  body = json.dumps({"name": name, "arguments": {"expression": expression}})
  return f"<tool_call>{body}</tool_call>"


def demonstration(record: dict, rng: random.Random | None = None, *,
                  teacher_skip_tool: float = 0.0, teacher_wrong_name: float = 0.0) -> list[dict]:
  """The conversation after the opening: the teacher's turns and the tool's replies (what
  `CalculatorEnv` answers to them)."""
  answer = str(record["answer"])
  rng = rng or random.Random(0)
  if rng.random() < teacher_skip_tool:
    return [{"role": "assistant", "content": answer}]
  name = "calculator" if rng.random() < teacher_wrong_name else "calc"
  call = tool_call(name, record["prompt"])
  env = calculator_env.CalculatorEnv()  # tools run in this thread: no worker process
  opening = env.reset(record)
  reply = env.step(opening + [{"role": "assistant", "content": call}]).messages
  return [{"role": "assistant", "content": call}, *reply, {"role": "assistant", "content": answer}]


TASK = base.Task(
    load_split=load_split, demonstration=demonstration,
    reward_functions=("jaxrl_llm.rewards.calculator:calculator_exact",
                      "jaxrl_llm.rewards.calculator:calculator_valid_call"),
    reward_weights=(1.0, 0.0), teacher_options=("teacher_skip_tool", "teacher_wrong_name"))
