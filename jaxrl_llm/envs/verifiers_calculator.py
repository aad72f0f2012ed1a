"""The calculator task as a verifiers (>= 0.4, `verifiers.v1`) taskset, for
`jaxrl_llm.envs.verifiers_agent` (configs/grpo_verifiers_calculator.py).

  VF_TASKSET=jaxrl_llm.envs.verifiers_calculator   (the taskset id: this module)

Needs `pip install verifiers==0.4.0 uv`. A task is one product ('47*83', answer 3901,
`jaxrl_llm.tasks.calculator` records); the model gets the MCP tool `calc(expression)` from
a taskset-scoped `vf.Toolset` (one tool server for the whole run, its tool named bare
`calc`: `TOOL_PREFIX = None`), and the reward is exact match of the last reply's first
line with the product (what `jaxrl_llm.envs.calculator_agent` rewards).
"""
import re

import verifiers.v1 as vf

from jaxrl_llm.envs.calculator_agent import calc as _calc

__all__ = ["CalculatorTaskset"]  # verifiers loads the one Taskset a module exports


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
  """The `calc` tool: an MCP server verifiers starts as `python -m <this module>`."""
  TOOL_PREFIX = None  # the tool is `calc`, not `calc_toolset_calc`

  @vf.tool
  def calc(self, expression: str) -> str:
    """Evaluates an arithmetic expression of integers (digits, + - * / and parentheses)."""
    try:
      return _calc(expression)
    except Exception as e:  # pylint: disable=broad-except
      return f"error: {type(e).__name__}: {e}"


class CalculatorData(vf.TaskData):
  answer: int = 0


class CalculatorTask(vf.Task[CalculatorData]):

  @vf.reward(weight=1.0)
  async def exact(self, trace: vf.Trace) -> float:
    line = (trace.last_reply or "").partition("\n")[0].strip()
    return float(re.fullmatch(r"-?\d+", line) is not None and int(line) == self.data.answer)


class CalculatorConfig(vf.TasksetConfig):
  split: str = "train"
  num_tasks: int = 1000


class CalculatorTaskset(vf.Taskset[CalculatorTask, CalculatorConfig]):
  """`jaxrl_llm.tasks.calculator.load_split(split)`'s first `num_tasks` records (the agent
  adapter builds tasks from the trainer's records instead, with `CalculatorData`'s
  fields)."""

  def load(self):
    from jaxrl_llm.tasks import calculator  # pylint: disable=g-import-not-at-top
    records = calculator.load_split(self.config.split, num_train=self.config.num_tasks)
    for r in list(records)[:self.config.num_tasks]:
      yield CalculatorTask(CalculatorData(prompt=r["prompt"], answer=int(r["answer"])),
                           self.config.task)

  @classmethod
  def toolsets(cls, config):
    return [CalcToolset(vf.SharedToolsetConfig())]


if __name__ == "__main__":  # the tool server's process
  CalcToolset.run()
