"""Rewards of the built-in agent task `calculator` (jaxrl_llm/tasks/calculator.py).

  calculator_valid_call  1.0 if the episode called a tool and every call succeeded (no
                         tool message is an error), else 0.0: the valid-call rate.

It reads the episode's `messages` (the trainer passes them for multi-turn sources).
"""


def calculator_valid_call(prompts: list[str], completions: list[str], messages: list,
                          **unused_fields) -> list[float]:
  del prompts, completions, unused_fields
  rates = []
  for conversation in messages:
    replies = [m["content"] for m in conversation if m["role"] == "tool"]
    rates.append(float(bool(replies) and not any(r.startswith("error:") for r in replies)))
  return rates
