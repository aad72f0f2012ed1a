"""`config.judge` checked before anything loads (`validate` calls `check_judge`)."""
from __future__ import annotations

import math
import re

import jax

from jaxrl_llm import import_path
from jaxrl_llm.config.errors import ConfigError
from jaxrl_llm.config.errors import one_of as _one_of
from jaxrl_llm.models import config as model_config
from jaxrl_llm.models import load as model_load

KINDS = ("classifier", "generative")


def check_judge(config) -> None:
  """A judge's kind, weight, sources and sizes; its directory (a classifier's score head, a
  generative judge's template and parser). Raises `ConfigError` naming the field."""
  j = config.get("judge")
  if j is None or not j.path:
    return
  _one_of("judge.kind", j.kind, KINDS)
  if isinstance(j.weight, bool) or not isinstance(j.weight, (int, float)) or not math.isfinite(j.weight):
    raise ConfigError(f"config.judge.weight={j.weight!r}: expected a finite number")
  names = list(config.sources.keys())
  unknown = [n for n in j.sources if n not in names]
  if unknown:
    raise ConfigError(f"config.judge.sources={tuple(j.sources)!r}: {unknown[0]!r} is not a source; "
                      f"expected names of config.sources {names} (or () for every source)")
  for field in ("max_len", "batch_size", "max_new_tokens"):
    value = j[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f"config.judge.{field}={value!r}: expected a positive integer")
  hf = _model_dir(j.path)
  if j.kind == "classifier":
    _check_classifier(j.path, hf)
  else:
    _check_generative(j)


def _model_dir(path: str) -> dict:
  try:
    hf = model_load.check_model_dir(path)
    model_config.from_hf_dict(hf)
  except (OSError, ValueError) as e:
    raise ConfigError(f"config.judge.path={path!r}: {e}") from e
  return hf


def _check_classifier(path: str, hf: dict) -> None:
  """A sequence-classification checkpoint of one label, with its score head."""
  architectures = hf.get("architectures") or []
  labels = len(hf.get("id2label") or {}) or hf.get("num_labels", 1)
  names = model_load.tensor_names(path)
  head = "score.weight" in names if names is not None else any(
      a.endswith("ForSequenceClassification") for a in architectures)
  if not head:
    raise ConfigError(f"config.judge.path={path!r} (architectures {architectures}) has no score "
                      "head (score.weight): expected a *ForSequenceClassification reward model "
                      "with judge.kind='classifier', or judge.kind='generative' for a causal LM")
  if labels != 1:
    raise ConfigError(f"config.judge.path={path!r} classifies into {labels} labels: expected a "
                      "reward model of one label (its score is the reward)")


def _check_generative(j) -> None:
  """One process; a template that shows the completion; a parser that resolves or compiles."""
  if jax.process_count() > 1:
    raise ConfigError(f"config.judge.kind='generative' on {jax.process_count()} processes: "
                      "expected one process, or kind='classifier' (a generative judge samples "
                      "with the policy's sampler, whose programs span every process, while each "
                      "process scores its own rows on its own devices)")
  if "{completion}" not in j.template:
    raise ConfigError(f"config.judge.template={j.template[:80]!r}...: expected a template with "
                      "{completion} (and usually {prompt}), which the judge is asked about")
  if re.fullmatch(r"[\w.]+:\w+", j.parser):
    try:
      import_path.load_function(j.parser, field="config.judge.parser")
    except import_path.ImportPathError as e:
      raise ConfigError(str(e)) from e
    return
  try:
    re.compile(j.parser)
  except re.error as e:
    raise ConfigError(f"config.judge.parser={j.parser!r} is not a regular expression ({e}): "
                      "expected a regex whose first group is the score, or 'pkg.module:fn'") from e
