"""`launch.compile --search`: the micro-batch and remat policy that make a step fastest by
the compiler's roofline while every program still fits.

Both decide the update's temporaries and its recomputation (and the micro-batches of the
forwards in `prepare`): a larger micro-batch re-gathers the weights fewer times, remat
'full' recomputes each layer in the backward but keeps only its input. Every candidate
compiles `prepare` and the updates (the sampler does not depend on them); the rest of the
step is added from one analysis of the config as given.
"""
from __future__ import annotations

import dataclasses

from jaxrl_llm import config as config_lib
from jaxrl_llm import sharding as sh
from jaxrl_llm import training
from jaxrl_llm.aot import analysis

REMATS = ("full", "dots", "none")
UPDATE_PROGRAMS = ("prepare", "policy_update", "value_update")


@dataclasses.dataclass
class Candidate:
  micro_batch_size: int
  remat: str
  result: analysis.StepReport | None  # None: the config refuses these values
  why_not: str = ""  # the config's error


def micro_batches(config, devices) -> list[int]:
  """The micro-batch sizes to try, largest first: the config's, twice it (up to a whole
  minibatch), and its half and quarter (down to one row per batch shard: below that,
  devices would repeat each other's rows), those that divide a minibatch."""
  rows = (config.train.prompts_per_step * config.sampling.num_samples
          // config.algo.num_minibatches)
  mesh = sh.split_meshes(config.mesh, devices)[0]
  per_shard = sh.rows_sharding(rows, mesh, sh.freeze_rules(config.mesh.rules)).shard_shape(
      (rows,))[0]
  shards = rows // per_shard
  micro = config.train.micro_batch_size
  sizes = {min(2 * micro, rows), micro, micro // 2, micro // 4}
  return sorted((s for s in sizes if s >= shards and rows % s == 0 and s % shards == 0),
                reverse=True)


def search(config, devices, topology: str, margin: float) -> list[Candidate]:
  """Compiles the update programs of `config` for every micro-batch and remat policy."""
  out = []
  for micro in micro_batches(config, devices):
    for remat in REMATS:
      candidate = config.copy_and_resolve_references()
      with candidate.unlocked():
        candidate.train.micro_batch_size, candidate.model.remat = micro, remat
      try:
        config_lib.validate(candidate, devices)
      except config_lib.ConfigError as e:
        out.append(Candidate(micro, remat, None, " ".join(str(e).split())))
        continue
      plan = training.make_plan(candidate)
      setup = training.set_up(candidate, plan, devices, abstract=True)
      out.append(Candidate(micro, remat, analysis.analyse(
          candidate, plan, setup, topology, margin, only=UPDATE_PROGRAMS)))
  return out


def update_time(result: analysis.StepReport) -> float:
  """Seconds of a step's update programs by the roofline."""
  return sum(p.roofline_s * p.calls_per_step for p in result.programs)


def best(candidates: list[Candidate]) -> Candidate | None:
  """The candidate whose update programs all fit and take the least time, or None."""
  fitting = [c for c in candidates if c.result is not None and c.result.all_fit]
  return min(fitting, key=lambda c: update_time(c.result)) if fitting else None


def table(candidates: list[Candidate], chosen: Candidate | None) -> str:
  """One row per candidate: the update programs' peaks and roofline."""
  lines = ["| micro-batch | remat | peak GiB (prepare, update) | fits | update roofline s |",
           "|---|---|---|---|---|"]
  for c in candidates:
    mark = " (best)" if c is chosen else ""
    if c.result is None:
      lines.append(f"| {c.micro_batch_size} | {c.remat} | refused: {c.why_not} | no | |")
      continue
    peaks = ", ".join(f"{p.peak_bytes / 2**30:.1f}" for p in c.result.programs)
    lines.append(f"| {c.micro_batch_size}{mark} | {c.remat} | {peaks} | "
                 f"{'yes' if c.result.all_fit else 'no'} | {update_time(c.result):.3g} |")
  return "\n".join(lines)
