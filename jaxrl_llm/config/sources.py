"""Training sources: where each step's prompts come from and the algorithm each row gets.

A run has one source (`config.data` with `config.rewards`, the algorithm `config.algo`)
or several (`config.sources.NAME`, each a `schema.source_config()`): its data, its share
of every step's prompts (`weight`), its reward functions and its per-row algorithm axes
(`algo`: the advantage estimator and its normalisation, the policy-gradient weight
`loss.pg_coef`, distillation: `distill.coef`, `shaping_coef` and the teacher, a model or
the policy after a hint). What is per row
overlays `config.algo`; the loss, the trust region, the KL term and the rest stay one per
run, as in prime-rl, where "the algorithm is set per training source" and "the RL loss is
chosen once for the run". `run_sources(config)` gives either kind of run as a tuple of
`Source`s, so the trainer handles both alike.

Every row of a mixed batch carries its source's index; the prepare program computes each
distinct advantage setting over the whole batch and keeps, per row, its source's
(`training/prepare.py`), and the loss weighs each row by its source's coefficients
(`objectives.policy_loss`): arrays, never branches, so a batch of any mix runs the same
compiled program.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_collections

from jaxrl_llm.config import env_schema, schema

# Estimator settings that normalise over the whole batch rather than per group or per row:
# in a mixed batch they would mix the sources' rows, so a mixed run refuses them.
BATCH_NORMALISED = {"advantage.scale": ("batch",), "advantage.estimator": ("reinforce_pp_baseline",)}


@dataclasses.dataclass(frozen=True)
class Source:
  """One source of training prompts, resolved from the config.

  Attributes:
    name: `config.sources`' key ('' for a one-source run's `config.data`).
    data: the data spec (`data.source`'s syntax); task_options: a `task:` source's options.
    weight: its share of each step's prompts, normalised over the run's sources.
    rewards: its `config.rewards`-shaped reward functions and weights.
    algo: `config.algo` with this source's per-row fields in place, references resolved.
    env: its environment fields (`env_schema.env_config()`: `env`, `env_args`, `max_turns`, ...);
      `env['env']` is '' for a single-turn source.
  """
  name: str
  data: str
  task_options: dict
  weight: float
  rewards: Any
  algo: Any
  env: dict = dataclasses.field(default_factory=dict)

  @property
  def multi_turn(self) -> bool:
    return bool(self.env.get("env") or self.env.get("agent"))

  @property
  def field(self) -> str:
    """Where its settings are: 'config.data' or 'config.sources.NAME'."""
    return f"config.sources.{self.name}" if self.name else "config.data"


ENV_FIELDS = tuple(env_schema.env_config())


def _env_fields(group) -> dict:
  return {k: (group[k].to_dict() if isinstance(group[k], ml_collections.ConfigDict)
              else group[k]) for k in ENV_FIELDS}


def is_mixed(config) -> bool:
  """Whether the run names its sources (`config.sources`) rather than `config.data`."""
  return len(config.sources) > 0


def per_row_fields(group=None, prefix: str = "") -> list[str]:
  """The dotted `config.algo` paths a source sets for its rows: every leaf of
  `schema.source_config().algo`."""
  group = schema.source_config().algo if group is None else group
  out = []
  for key, value in group.items():
    if isinstance(value, ml_collections.ConfigDict):
      out += per_row_fields(value, f"{prefix}{key}.")
    else:
      out.append(f"{prefix}{key}")
  return out


def _get(group, path: str):
  for key in path.split("."):
    group = group[key]
  return group


def source_algo(config, name: str):
  """`config.algo` with `config.sources[name].algo`'s per-row fields in place (a copy)."""
  algo = config.algo.copy_and_resolve_references()
  overlay = config.sources[name].algo
  with algo.unlocked():
    for path in per_row_fields():
      *groups, key = path.split(".")
      _get(algo, ".".join(groups))[key] = _get(overlay, path)
  return algo


def run_sources(config) -> tuple[Source, ...]:
  """The run's sources in `config.sources`' order (one, named '', without it)."""
  if not is_mixed(config):
    return (Source("", config.data.source, dict(config.data.task_options), 1.0,
                   _judged(config, "", config.rewards), config.algo.copy_and_resolve_references(),
                   _env_fields(config.data)),)
  return tuple(Source(name, s.data, dict(s.task_options), float(s.weight),
                      _judged(config, name, s.rewards), source_algo(config, name), _env_fields(s))
               for name, s in config.sources.items())


JUDGE_FUNCTION = "jaxrl_llm.rewards.judge:judge"  # the reward function of `config.judge`


def _judged(config, name: str, rewards):
  """A source's `rewards`, with `config.judge` after its functions where the judge scores
  it (`judge.sources`: its name, or () for every source)."""
  judge = config.get("judge")
  if judge is None or not judge.path or (judge.sources and name not in judge.sources):
    return rewards
  return ml_collections.ConfigDict({"functions": tuple(rewards.functions) + (JUDGE_FUNCTION,),
                                    "weights": tuple(rewards.weights) + (judge.weight,)})


def rows_per_prompt(config) -> int:
  """Training rows of each prompt: its G completions or episodes (`sampling.num_samples`),
  times the samples an agent program's episode may give (`agent_samples`, one value for
  the run)."""
  def samples(source) -> int:  # a bad value counts 1 here (`validate` names it)
    k = source.env.get("agent_samples", 1)
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else 1
  return config.sampling.num_samples * max(samples(s) for s in run_sources(config))


def data_config(config, source: Source):
  """`config.data` with `source`'s data spec and task options in place: what
  `data.load_dataset` reads for it (the prompt settings stay the run's)."""
  data_cfg = config.data.copy_and_resolve_references()
  with data_cfg.unlocked():
    data_cfg.source = source.data
    data_cfg.task_options = ml_collections.ConfigDict(source.task_options)
  return data_cfg


def check_sources(config) -> list[str]:
  """Problems with `config.sources` (names, weights, data, per-row settings); [] if none."""
  if not is_mixed(config):
    return []
  errors: list[str] = []
  default_run = schema.base_config()
  for field, instead, value, default in (
      ("data.source", "data", config.data.source, default_run.data.source),
      ("data.task_options", "task_options", config.data.task_options.to_dict(),
       default_run.data.task_options.to_dict()),
      ("rewards", "rewards", config.rewards.to_dict(), default_run.rewards.to_dict()),
      *((f"data.{k}", k, _env_fields(config.data)[k], _env_fields(default_run.data)[k])
        for k in ENV_FIELDS)):
    if value != default:
      errors.append(f"config.{field} is not read when config.sources is set: expected its "
                    f"default here and config.sources.NAME.{instead} for each source")
  for path in per_row_fields():
    value, default = _get(config.algo, path), _get(default_run.algo, path)
    if value != default:
      errors.append(f"config.algo.{path}={value!r} is set per source when config.sources is "
                    f"set: expected the default {default!r} here and "
                    f"config.sources.NAME.algo.{path} instead")
  if config.data.completions != "sample":
    errors.append(f"config.data.completions={config.data.completions!r}: config.sources are "
                  "sampled by the policy: expected 'sample'")
  weights = []
  for name, s in config.sources.items():
    if not name.isidentifier():
      errors.append(f"config.sources.{name}: expected a name of letters, digits and _ "
                    "(it names metrics and checkpoint fields)")
    w = s.weight
    if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
      errors.append(f"config.sources.{name}.weight={w!r}: expected a finite number >= 0")
    else:
      weights.append(w)
    if len(config.sources) > 1:
      for path, refused in BATCH_NORMALISED.items():
        group, key = path.split(".")
        if s.algo[group][key] in refused:
          errors.append(f"config.sources.{name}.algo.{path}={s.algo[group][key]!r} normalises "
                        "over the whole batch, which a mixed batch shares with other sources: "
                        "expected a per-group or per-row setting (e.g. scale 'group')")
  if len(weights) == len(config.sources) and not sum(weights) > 0:
    errors.append(f"config.sources: every weight is 0 ({weights}): expected at least one > 0")
  return errors
