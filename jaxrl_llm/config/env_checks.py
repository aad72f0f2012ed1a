"""The checks of multi-turn sources' fields (`env_schema.env_config`): environments and agent
programs, and what they do not combine with yet (`validate` runs them)."""
from __future__ import annotations

import inspect
import math

from jaxrl_llm import import_path
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.config.errors import ConfigError
from jaxrl_llm.config.errors import fail as _fail
from jaxrl_llm.config.errors import one_of as _one_of

ENV_ERRORS = ("stop", "drop")  # on_env_error


def check_envs(config, platform_name: str) -> None:
  """Multi-turn sources (`env` set): their fields, and what they do not combine with yet
  (their episodes played on platform `platform_name`: 'cpu', 'gpu' or 'tpu')."""
  run = sources_lib.run_sources(config)
  multi = [s for s in run if s.multi_turn]
  for role, alpha in config.algo.echo.items():
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (
        math.isfinite(alpha) and alpha >= 0):
      _fail(f"algo.echo.{role}", alpha, "a finite weight >= 0 (0 = off)")
    if alpha and not multi:
      _fail(f"algo.echo.{role}", alpha, "0: echo trains on environment tokens, which only "
            "multi-turn sources (config.data.env / config.sources.NAME.env) have")
  if not multi:
    return
  for s in multi:
    e, where = s.env, s.field.removeprefix("config.")
    if e["agent"]:
      _check_agent(config, s)
    else:
      import_path.load_function(e["env"], field=f"{s.field}.env")  # a typo fails here
      _check_admission(config, platform_name)
    for key in ("max_turns", "env_workers"):
      if isinstance(e[key], bool) or not isinstance(e[key], int) or e[key] < 1:
        _fail(f"{where}.{key}", e[key], "an integer >= 1")
    if isinstance(e["max_episode_tokens"], bool) or not isinstance(
        e["max_episode_tokens"], int) or e["max_episode_tokens"] < 2:
      _fail(f"{where}.max_episode_tokens", e["max_episode_tokens"],
            "an integer >= 2 (the opening prompt and at least one model token)")
    if not isinstance(e["tool_timeout_s"], (int, float)) or not e["tool_timeout_s"] > 0:
      _fail(f"{where}.tool_timeout_s", e["tool_timeout_s"], "a positive number of seconds")
    _one_of(f"{where}.on_env_error", e["on_env_error"], ENV_ERRORS)
    if not isinstance(e["env_args"], dict):
      _fail(f"{where}.env_args", e["env_args"], "a dict of the environment's keyword arguments")
  samples = {s.env["agent_samples"] for s in run}
  if len(samples) > 1:
    raise ConfigError(f"config.sources have agent_samples {sorted(samples)}: expected one value "
                      "for every source (the rows of each prompt)")
  for s in multi:
    if s.env["agent_samples"] != 1 and not s.env["agent"]:
      _fail(f"{s.field.removeprefix('config.')}.agent_samples", s.env["agent_samples"],
            "1 without an agent program (an environment's episode is one trajectory)")
  if len(multi) != len(run):
    single = [s.name for s in run if not s.multi_turn]
    raise ConfigError(f"config.sources {single} have no env while others do: expected every "
                      "source of a multi-turn run to name an environment (a single-turn source "
                      "can be one whose environment is done after the first turn)")
  algo = config.algo
  for field, value, expected in (
      ("algo.dynamic_sampling.enabled", algo.dynamic_sampling.enabled, False),
      ("algo.overlong.enabled", algo.overlong.enabled, False)):
    if value != expected:
      _fail(field, value, f"{expected!r} with multi-turn sources (not supported with episodes)")
  for s in multi:
    d = s.algo.distill
    if d.teacher == "self" and (d.coef or d.shaping_coef):
      _fail(f"{s.field.removeprefix('config.')}.algo.distill.teacher", d.teacher,
            "'model' with an environment (a hint before an episode is not supported)")


def episode_engine(config, platform_name: str) -> str:
  """'turns' or 'slots': what plays this run's episodes on platform `platform_name`
  (`sampling.engine_kind`)."""
  from jaxrl_llm import sampling  # pylint: disable=g-import-not-at-top
  settings = sampling.settings.from_config(config.sampling, eos_ids=(), pad_id=0)
  return sampling.engine_kind(settings, "episodes", platform_name)


def _check_admission(config, platform_name: str) -> None:
  """Episodes admitted on the slot engine sample with temperature and top-p only."""
  if not config.sampling.top_k:
    return
  if episode_engine(config, platform_name) == "slots":
    _fail("sampling.top_k", config.sampling.top_k, "0 with episodes admitted one at a time "
          f"(config.sampling.engine={config.sampling.engine!r} samples them with temperature "
          "and top-p), or config.sampling.engine='static' (turn-synchronous episodes)")


def _check_agent(config, source) -> None:
  """An agent program (`agent`): an async function, and what it does not combine with."""
  e, where = source.env, source.field.removeprefix("config.")
  if e["env"]:
    _fail(f"{where}.agent", e["agent"], f"'' while {where}.env={e['env']!r} is set: a source "
          "plays an environment or an agent program, not both")
  run = import_path.load_function(e["agent"], field=f"{source.field}.agent")
  if not inspect.iscoroutinefunction(run):
    _fail(f"{where}.agent", e["agent"], "an `async def run(client, record)` returning the reward")
  if isinstance(e["agent_timeout_s"], bool) or not isinstance(
      e["agent_timeout_s"], (int, float)) or not e["agent_timeout_s"] > 0:
    _fail(f"{where}.agent_timeout_s", e["agent_timeout_s"], "a positive number of seconds")
  if config.data.completions != "sample":
    _fail("data.completions", config.data.completions, "'sample' with an agent program (its "
          "episodes are played, not read from the data)")
  if config.sampling.top_k:
    _fail("sampling.top_k", config.sampling.top_k, "0 with an agent program (its endpoint "
          "samples with temperature and top-p)")
  k = e["agent_samples"]
  if isinstance(k, bool) or not isinstance(k, int) or k < 1:
    _fail(f"{where}.agent_samples", k, "an integer >= 1")
  if k > 1:
    a = source.algo.advantage
    # An episode's K rows carry its reward K times: group means and population stds are
    # the episode-level ones; RLOO's leave-one-out and an unbiased std are not.
    if not a.fn and a.estimator == "rloo":
      _fail(f"{where}.agent_samples", k, "1 with the rloo estimator (its leave-one-out "
            "baseline would count an episode's other rows)")
    if a.std_ddof:
      _fail(f"{where}.agent_samples", k, "1 with algo.advantage.std_ddof != 0")
