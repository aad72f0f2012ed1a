"""What each program of a step needs of one chip, from the compiler: memory, work, time.

For every program of `step.step_programs`, compiled for the target's devices:
  - XLA's `memory_analysis()`: argument, output, alias and temporary bytes per chip;
  - what else is resident at that moment (`step.resident_buffers` not among its
    arguments), and the peak: arguments + outputs not aliased to a donated argument +
    temporaries + the resident rest;
  - FLOPs, HBM bytes and collective bytes per chip from the compiled HLO with every loop
    counted its number of times (`hlo_cost`; XLA's own `cost_analysis()` counts a loop body
    once), the decode loop at its bound (every completion at `max_new_tokens`);
  - the grouped matmuls of an MoE layer (megablox `gmm`, `tgmm`) counted at the share of
    their worst-case buffer a chip's experts get when the router spreads assignments
    evenly (`StepProgram.expert_share`), not at their whole buffer as their estimate is;
  - a roofline time: the larger of FLOPs / the chip's peak and HBM bytes / its bandwidth
    (`chips.CHIPS`): a lower bound on the program's time, not a measurement.
A step's roofline adds its programs' (each times its calls per step; with split placement
and asynchronous rollouts the sampler's chips and the trainer's overlap), and the MFU bound
is the step's model FLOPs (`training.flops`) over that time at the peak of every chip.
"""
from __future__ import annotations

import dataclasses
import math
import re

import jax

from jaxrl_llm.aot import chips as chips_lib
from jaxrl_llm.aot import hlo_cost
from jaxrl_llm.aot import step as step_lib

_KERNEL = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+?)(?:\.\d+)? = .*custom_call_target="tpu_custom_call"',
                     re.M)
# megablox's grouped matmuls: their cost estimate covers the whole static buffer.
GROUPED_MATMULS = ("gmm", "tgmm")
_TEMPORARIES = re.compile(r"temporaries \(([\d.]+)([KMGT])\)")


@dataclasses.dataclass
class ProgramReport:
  """One compiled program on one chip of its placement (bytes and FLOPs per chip).

  `error`: XLA:TPU's message when it refused to compile the program (out of HBM); its
  temporaries are then what the message names.
  """
  name: str
  placement: str
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  resident: dict[str, int]
  flops: float
  bytes_accessed: float
  collective_bytes: float
  roofline_s: float
  calls_per_step: float
  model_flops: float
  kernels: tuple[str, ...]
  error: str | None = None

  @property
  def peak_bytes(self) -> int:
    return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + sum(self.resident.values()))


@dataclasses.dataclass
class StepReport:
  """Every program of a step on a topology (`analyse`)."""
  topology: str
  chip: chips_lib.Chip
  devices: dict[str, int]  # placement -> chips
  programs: list[ProgramReport]
  overlapped: bool  # the sampler's own chips run while the trainer's update
  margin: float  # the share of HBM a program must leave free to fit

  def fits(self, program: ProgramReport) -> bool:
    return program.error is None and program.peak_bytes <= (1 - self.margin) * self.chip.hbm_bytes

  @property
  def all_fit(self) -> bool:
    return all(self.fits(p) for p in self.programs)

  @property
  def refused(self) -> list[str]:
    """The programs XLA:TPU refused to compile (out of HBM): they have no time."""
    return [p.name for p in self.programs if p.error is not None]

  @property
  def step_roofline_s(self) -> float:
    """The step's roofline; NaN when a program was refused (its time is unknown, not 0)."""
    if self.refused:
      return math.nan
    time = {}
    for p in self.programs:
      time[p.placement] = time.get(p.placement, 0.0) + p.roofline_s * p.calls_per_step
    return max(time.values()) if self.overlapped else sum(time.values())

  @property
  def mfu_bound(self) -> float:
    work = sum(p.model_flops * p.calls_per_step for p in self.programs)
    chips = sum(self.devices.values())
    return work / max(self.step_roofline_s * self.chip.peak_flops * chips, 1e-30)

  def to_json(self) -> dict:
    return {"topology": self.topology, "chip": self.chip.name, "hbm_bytes": self.chip.hbm_bytes,
            "programs": {p.name: {"peak_bytes": p.peak_bytes, "temp_bytes": p.temp_bytes,
                                  "flops": p.flops, "bytes_accessed": p.bytes_accessed,
                                  "roofline_s": p.roofline_s} for p in self.programs},
            "step_roofline_s": None if self.refused else self.step_roofline_s,
            "mfu_bound": None if self.refused else self.mfu_bound,
            "fits": self.all_fit}


def kernels(hlo_text: str) -> tuple[str, ...]:
  """The Pallas/Mosaic kernels a compiled TPU program calls (e.g. splash attention's
  'splash_mqa_fwd_segmented_residuals'), sorted."""
  return tuple(sorted(set(_KERNEL.findall(hlo_text))))


def _refused(error: Exception) -> int | None:
  """The temporaries XLA:TPU names when it refuses a program for want of HBM, else None."""
  found = _TEMPORARIES.search(str(error))
  if "RESOURCE_EXHAUSTED" not in str(error) or not found:
    return None
  return int(float(found.group(1)) * 2 ** (10 * " KMGT".index(found.group(2))))


def analyse_program(program: step_lib.StepProgram, chip: chips_lib.Chip,
                    resident: dict[str, int]) -> ProgramReport:
  """Compiles `program` and reports it (see the module docstring); `resident`: the bytes
  per chip of what stays beside it (its placement's resident buffers that it does not take
  as arguments)."""
  lowered = program.lower()
  common = dict(name=program.name, placement=program.placement, resident=resident,
                calls_per_step=program.calls_per_step, model_flops=program.model_flops)
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    temp = _refused(e)
    if temp is None:
      raise
    return ProgramReport(argument_bytes=0, output_bytes=0, alias_bytes=0, temp_bytes=temp,
                         flops=0.0, bytes_accessed=0.0, collective_bytes=0.0, roofline_s=0.0,
                         kernels=(), error=" ".join(str(e).split()), **common)
  memory = compiled.memory_analysis()
  text = compiled.as_text()
  cost = hlo_cost.program_cost(text, dynamic_trips=program.decode_steps, kernel_shares={
      kernel: program.expert_share for kernel in GROUPED_MATMULS})
  roofline = max(cost.flops / chip.peak_flops, cost.bytes_accessed / chip.hbm_bandwidth)
  return ProgramReport(
      argument_bytes=memory.argument_size_in_bytes, output_bytes=memory.output_size_in_bytes,
      alias_bytes=memory.alias_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
      flops=cost.flops, bytes_accessed=cost.bytes_accessed,
      collective_bytes=cost.collective_bytes, roofline_s=roofline, kernels=kernels(text),
      **common)


def analyse(config, plan, setup, topology: str, margin: float = 0.0,
            only: tuple[str, ...] = ()) -> StepReport:
  """Compiles every program of a step of `config` (`only`: those named) for the devices of
  `setup` (`training.set_up(config, plan, devices, abstract=True)`)."""
  devices = setup.models.mesh.devices.flatten().tolist()
  chip = chips_lib.chip_of(devices)
  buffers = step_lib.resident_buffers(config, plan, setup)
  reports = []
  for program in step_lib.step_programs(config, plan, setup):
    if only and program.name not in only:
      continue
    beside = {name: size for name, (where, size) in buffers.items()
              if where == program.placement and name not in program.arguments}
    reports.append(analyse_program(program, chip, beside))
  placements = {step_lib.TRAINER: setup.models.mesh.size}
  if setup.models.rollout_policy is not None:
    placements[step_lib.SAMPLER] = setup.models.rollout_policy.mesh.size
  return StepReport(topology, chip, placements, reports,
                    overlapped=len(placements) > 1 and plan.max_async_level > 0, margin=margin)
