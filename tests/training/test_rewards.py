"""Reward functions that the trainer tests name by import path."""


def count_a(prompts, completions, **fields):
  """How many 'a' characters a completion holds: one target token, easy to learn."""
  del prompts, fields
  return [float(c.count("a")) for c in completions]


def nan_for_second(prompts, completions, **fields):
  del fields
  return [float("nan") if i == 1 else 0.0 for i in range(len(completions))]


def count_lowercase(prompts, completions, **fields):
  """How many lowercase ASCII letters a completion holds: dense enough for a random model."""
  del prompts, fields
  return [float(sum("a" <= ch <= "z" for ch in c)) for c in completions]
