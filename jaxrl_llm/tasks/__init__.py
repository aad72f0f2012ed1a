"""Built-in tasks with verifiable rewards, looked up by name.

`config.data.source = 'task:NAME'` reads a task's split through `load_split`;
a task's options (difficulty, split sizes, seed) are plain keyword arguments.

  from jaxrl_llm import tasks
  train = tasks.load_split('arithmetic', 'train', max_value=50)   # len + indexing
  sft = tasks.demonstrations('arithmetic', 'train')   # records + 'completion'
  tasks.TASKS['arithmetic'].reward_functions          # import paths for config.rewards

Tasks: `arithmetic` (`12+7*3=` -> `33`), `countdown` (reach a target with + - * /),
`calculator` (an agent task: `47*83` with a calculator tool; its environment is
`jaxrl_llm.envs.calculator:CalculatorEnv`).
"""
import functools
from typing import Sequence

from jaxrl_llm.tasks import arithmetic
from jaxrl_llm.tasks import base
from jaxrl_llm.tasks import calculator
from jaxrl_llm.tasks import countdown

TASKS = {
    "arithmetic": arithmetic.TASK,
    "calculator": calculator.TASK,
    "countdown": countdown.TASK,
}

_SPLIT_ALIASES = {"test": "eval", "validation": "eval"}


def get_task(name: str) -> base.Task:
  """The task called `name`, or a ValueError listing the ones there are."""
  if name not in TASKS:
    raise ValueError(f"Unknown task {name!r}; built-in tasks: {sorted(TASKS)}.")
  return TASKS[name]


def load_split(name: str, split: str, **options) -> Sequence[dict]:
  """Split 'train' or 'eval' ('test'/'validation' mean 'eval') of task `name`."""
  return get_task(name).load_split(_SPLIT_ALIASES.get(split, split), **options)


def demonstrations(name: str, split: str, **options) -> Sequence[dict]:
  """Like `load_split`, each record with its target `completion` added (for SFT).

  Options in the task's `teacher_options` (e.g. arithmetic's `teacher_carry_error`)
  also reach its `demonstration`; they change the completions, never the records.
  """
  task = get_task(name)
  records = load_split(name, split, **options)
  teacher = {k: v for k, v in options.items() if k in task.teacher_options}
  return base.Demonstrations(records, functools.partial(task.demonstration, **teacher),
                             key=f"{name}/{split}/demonstration")
