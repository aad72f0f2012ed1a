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


def fail_on_third_call(prompts, completions, _calls=[0], **fields):  # noqa: B006 -- a counter
  """Scores like `count_lowercase` twice, then raises: an error inside the rollout thread."""
  _calls[0] += 1
  if _calls[0] >= 3:
    raise RuntimeError("reward service down")
  return count_lowercase(prompts, completions, **fields)
