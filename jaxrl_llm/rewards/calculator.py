"""Rewards of the built-in agent task `calculator` (jaxrl_llm/tasks/calculator.py).

  calculator_exact       1.0 if the last model turn's first line is exactly the product
                         (`arithmetic_exact`'s rule: `3901`, not `3901.0` or `= 3901`):
                         the task's accuracy, logged as `reward/calculator_exact`.
  calculator_valid_call  1.0 if the episode called a tool and every call succeeded (no
                         tool message is an error), else 0.0: the valid-call rate.

It reads the episode's `messages` (the trainer passes them for multi-turn sources);
`calculator_exact` the last model turn (an episode's `completions`).
"""
from jaxrl_llm.rewards import arithmetic


def calculator_exact(prompts: list[str], completions: list[str], answer: list,
                     **fields) -> list[float]:
  """1.0 where the last model turn's first line is exactly the integer `answer`."""
  return arithmetic.arithmetic_exact(prompts, completions, answer, **fields)



def calculator_valid_call(prompts: list[str], completions: list[str], messages: list,
                          **unused_fields) -> list[float]:
  del prompts, completions, unused_fields
  rates = []
  for conversation in messages:
    replies = [m["content"] for m in conversation if m["role"] == "tool"]
    rates.append(float(bool(replies) and not any(r.startswith("error:") for r in replies)))
  return rates
