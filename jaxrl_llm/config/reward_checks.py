"""The reward functions of a run's sources, checked before anything loads.

`check_rewards(config)` (from `validate`): every source's functions resolve (an error
names `config.rewards.functions[i]` or `config.sources.NAME.rewards.functions[i]`), and a
source may name none only where something else carries the signal: an environment's step
rewards (`env`), a teacher (`algo.distill.coef` or `shaping_coef`) or, for SFT, the
dataset's completions. `check_fields(...)` (from `inputs.check_inputs`, on the records it
reads): every field a function reads is in the records (`RewardSet.missing_fields`), so
data without, say, `answer` is refused in one line instead of at step 0.
"""
from __future__ import annotations

from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.config.errors import ConfigError
from jaxrl_llm.rewards import RewardSet

# What the trainer passes a multi-turn source's functions beside the record's fields: the
# model's turns' texts and the conversation (training's `episode_fields`).
EPISODE_FIELDS = ("turns", "messages")
EXAMPLE = "'jaxrl_llm.rewards.arithmetic:arithmetic_exact'"


def rewards_field(source) -> str:
  """Where `source`'s functions are: 'config.rewards' or 'config.sources.NAME.rewards'."""
  return f"config.sources.{source.name}.rewards" if source.name else "config.rewards"


def reward_set(source, judge=None) -> RewardSet:
  """`source`'s functions, resolved (errors name their field); `config.judge`'s scores by
  `judge` (a `rewards.judge.Judge`; None: checks that only resolve the functions)."""
  bound = {} if judge is None else {sources_lib.JUDGE_FUNCTION: judge.reward}
  return RewardSet.from_config(source.rewards, rewards_field(source), bound)


def _signal(config, source) -> str:
  """What trains `source`'s rows besides its reward functions ('' = nothing)."""
  distill = source.algo.distill
  if source.multi_turn:
    return "its environment's step rewards"
  if distill.coef or distill.shaping_coef:
    return "the teacher (algo.distill)"
  if config.data.completions == "dataset":
    return "the dataset's completions (SFT)"
  return ""


def check_rewards(config) -> None:
  """Raises `ConfigError` for functions that do not resolve, or a source without functions
  where nothing else gives a signal (see the module docstring)."""
  sources = sources_lib.run_sources(config)
  for source in sources:
    field = rewards_field(source)
    if len(reward_set(source).paths) or _signal(config, source):
      continue
    algo = f"config.sources.{source.name}.algo" if source.name else "config.algo"
    raise ConfigError(f"{field}.functions=(): expected reward functions (import paths such as "
                      f"{EXAMPLE}): nothing else gives these rows a training signal (no "
                      f"environment in {source.field}.env, no teacher: {algo}.distill.coef "
                      "and shaping_coef are 0)")
  if config.train.eval_every > 0 and not sources[0].rewards.functions:
    raise ConfigError(f"config.train.eval_every={config.train.eval_every}: the held-out "
                      "evaluation reports the first reward function, and "
                      f"{rewards_field(sources[0])}.functions is (): expected 0 (no held-out "
                      "evaluation), or a reward function to evaluate with")
  if config.algo.dynamic_sampling.enabled:
    for source in sources:
      if not source.rewards.functions and not source.multi_turn:
        raise ConfigError(f"config.algo.dynamic_sampling.enabled=True keeps the groups whose "
                          f"rewards differ, and {rewards_field(source)}.functions is () (every "
                          "reward 0): expected False, or reward functions")


def check_fields(source, records, where: str) -> None:
  """Raises `ConfigError` naming `where` (the source and split), the function and the field
  when a function of `source` reads a field that one of `records` lacks, or cannot take one
  they have."""
  functions = reward_set(source)
  extra = EPISODE_FIELDS if source.multi_turn else ()
  for i, record in enumerate(records):
    fields = set(record) - {"prompt"}
    for path, name in functions.missing_fields(fields | set(extra)):
      raise ConfigError(f"{where}: reward function {path!r} ({rewards_field(source)}.functions) "
                        f"reads the field {name!r}, which record {i} lacks (its fields: "
                        f"{sorted(record)}): expected records with {name!r}, or other reward "
                        "functions")
    for path, name in functions.unexpected_fields(fields | set(extra)):
      raise ConfigError(f"{where}: reward function {path!r} ({rewards_field(source)}.functions) "
                        f"takes no parameter {name!r}, a field of record {i}, and no "
                        "**fields: expected a function that takes **unused_fields")
