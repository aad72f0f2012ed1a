"""Reward functions for `reward_set_test`, named there by import path."""
import numpy as np


def length(prompts, completions, **unused):
  del prompts, unused
  return [float(len(c)) for c in completions]


def matches_answer(prompts, completions, answer, **unused):
  del prompts, unused
  return [c == a for c, a in zip(completions, answer)]  # bools: count as 0/1


def numpy_values(prompts, completions, **unused):
  del prompts, unused
  return np.arange(len(completions), dtype=np.float64) / 2


def raises_on_boom(prompts, completions, **unused):
  del prompts, unused
  out = []
  for c in completions:
    if c == "boom":
      raise KeyError("no score for boom")
    out.append(0.0)
  return out


def raises_on_batches(prompts, completions, **unused):
  del completions, unused
  if len(prompts) > 1:
    raise RuntimeError("batch too large")
  return [0.0]


def drops_last(prompts, completions, **unused):
  del prompts, unused
  return [0.0] * (len(completions) - 1)


def one_too_many(prompts, completions, **unused):
  del prompts, unused
  return [0.0] * (len(completions) + 1)


def nan_on_second(prompts, completions, **unused):
  del prompts, unused
  return [float("nan") if i == 1 else 1.0 for i in range(len(completions))]


def inf_on_last(prompts, completions, **unused):
  del prompts, unused
  return [1.0] * (len(completions) - 1) + [float("-inf")]


def float32_overflow(prompts, completions, **unused):
  del prompts, unused
  return [1e39] * len(completions)


def string_value(prompts, completions, **unused):
  del prompts, unused
  return ["1.0"] * len(completions)


def none_value(prompts, completions, **unused):
  del prompts, unused
  return [None] * len(completions)


def returns_scalar(prompts, completions, **unused):
  del prompts, completions, unused
  return 1.0


def returns_string(prompts, completions, **unused):
  del prompts, completions, unused
  return "1111"
