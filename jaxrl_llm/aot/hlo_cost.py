"""FLOPs and bytes of a compiled program, every while loop counted as often as it runs.

XLA's `compiled.cost_analysis()` counts a loop's body once, and our programs are loops:
layers, micro-batches, chunked log-probs, the decode `while_loop`. `program_cost(
compiled.as_text())` multiplies each body by its trip count (nested loops multiply; a
condition runs once more than its body). Figures are per chip and follow HloCostAnalysis as
XLA:TPU applies it: with its loops run once, a program gets XLA's figures (tests/aot/):
  flops: 2 per multiply-add of dots and convolutions (padded or dilated taps skipped) and a
    Pallas kernel's `cost_estimate` (or the share of it `kernel_shares` names, with its
    bytes); not elementwise ops (XLA counts one per element of
    each, converts included: ~0.5% of a transformer step, and not model FLOPs).
  bytes_accessed: operands and results at their size in memory, tiles padded as XLA:TPU
    counts (f32[3,5]{1,0:T(4,128)} holds 4x128 floats, a scalar 128; VMEM counts too). A
    fusion counts its boundary: a parameter read through slices or gathers counts what they
    take (a layer scan reads one layer of the stacked weights, not the stack), an update in
    place what it writes. Tuples, bitcasts move nothing; an async copy counts 4x its bytes.
  collective_bytes: an all-gather's result, the others' operands (reduce-scatter,
    all-reduce, all-to-all, collective-permute), once per channel.
A conditional counts, per figure, its costliest branch (an upper bound, as XLA does).

Unlike XLA:TPU we count no sync flags (~4.6 KB an async copy) or tuple tables (512 bytes);
a gather's or scatter's rows, not whole (8,128) tiles of them; a Pallas kernel without a
cost estimate as its operands and results (XLA: unknown; splash attention is 1% of the
Qwen3-1.7B update's bytes). XLA's rule for async collective fusions (collectives overlapped
with matmuls) is not visible: we count a start (operand, result), continuations without
the buffers in flight, a done (result). Run once, the loops of the Qwen3-1.7B policy update
on v5e:2x4 get bytes 0.7% above XLA's.
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from jaxrl_llm.aot.hlo_text import (ARRAY, COLLECTIVES, Computation, Instruction, array_bytes,
                                    called, dimensions, parse_module, shape_bytes)

_NO_DATA = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
            "partition-id", "replica-id", "add-dependency", "opt-barrier", "domain",
            "slice-done", "call-done", "async-done"}  # the last: their start counted it all
# XLA:TPU's bookkeeping custom calls: they allocate or annotate, moving no data.
_NO_DATA_CALLS = {"AllocateBuffer", "AssumeGatherIndicesInBound", "PrepareAsyncCallStart",
                  "PrepareAsyncCallDone"}
# Custom kernels (Mosaic, Triton) whose FLOPs only their own `cost_estimate` gives.
_KERNELS = {"tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "mosaic_gpu_v2"}


@dataclasses.dataclass(frozen=True)
class Loop:
  """A while loop of the program.

  Attributes:
    name: the while instruction's name.
    trips: the trip count its body was multiplied by.
    counted: True when read from the program (a counter against a constant, or XLA's
      `known_trip_count`); False when it is the caller's `dynamic_trips`.
    depth: loops around it (0: in the entry computation or a call from it).
  """
  name: str
  trips: int
  counted: bool
  depth: int


@dataclasses.dataclass(frozen=True)
class ProgramCost:
  """Per-chip costs of one run of a program (the rules: the module docstring).

  Attributes:
    flops: FLOPs of dots, convolutions and estimated kernels, times trip counts.
    bytes_accessed: bytes the instructions read and write, times trip counts.
    collective_bytes: bytes the chip sends or receives in collectives, times trip counts.
    loops: every while loop, each before the loops inside it.
    uncounted_kernels: runs of custom kernels without a cost estimate (0 FLOPs, their
      operands and results as bytes), times trip counts.
  """
  flops: float
  bytes_accessed: float
  collective_bytes: float
  loops: tuple[Loop, ...]
  uncounted_kernels: float


def _dot_flops(comp: Computation, ins: Instruction) -> float:
  """2 x result elements x the contracted size of the left operand."""
  lhs = dimensions(ARRAY.search(comp.instructions[ins.operands[0]].shape).group(2))
  m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attrs)
  contracted = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m else 1
  return 2.0 * math.prod(dimensions(ARRAY.search(ins.shape).group(2))) * contracted


def _convolution_flops(comp: Computation, ins: Instruction) -> float:
  """2 x in features / feature groups x out features x batch / batch groups x, for each
  spatial dimension, the (kernel tap, output) pairs that read input, not padding or a hole
  of lhs dilation (XLA's GetConvolutionFlops)."""
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attrs)
  if labels is None:
    raise ValueError(f"convolution {ins.name}: no dim_labels, expected e.g. b01f_01io->b01f")
  shapes = [comp.instructions[o].shape for o in ins.operands[:2]] + [ins.shape]
  # label -> size: lhs["f"] input features, rhs["0"] kernel taps of spatial dimension 0...
  lhs, rhs, out = (dict(zip(label, dimensions(ARRAY.search(shape).group(2))))
                   for label, shape in zip(labels.groups(), shapes))
  group = lambda key: int((re.search(rf"{key}=(\d+)", ins.attrs) or [0, 1])[1])
  fma = (lhs["f"] // group("feature_group_count") * out["f"]
         * (lhs["b"] // group("batch_group_count")))
  window = re.search(r"window=\{([^}]*)\}", ins.attrs)
  fields = {key: [int(v.split("_")[0]) for v in values.split("x")]  # pad=lo_hi: lo
            for key, values in (f.split("=") for f in (window[1].split() if window else []))}
  for i, d in enumerate(sorted(c for c in lhs if c.isdigit())):
    stride, pad, lhs_dilate, rhs_dilate = (fields[k][i] if k in fields else default for k, default
                                           in (("stride", 1), ("pad", 0), ("lhs_dilate", 1),
                                               ("rhs_dilate", 1)))
    at = np.arange(out[d])[None, :] * stride - pad + np.arange(rhs[d])[:, None] * rhs_dilate
    fma *= int(((at % lhs_dilate == 0) & (at >= 0) & (at // lhs_dilate < lhs[d])).sum())
  return 2.0 * fma


def _in_place_bytes(fused: Computation, ins: Instruction) -> float | None:
  """What an update in place writes (a dynamic-update-slice's or scatter's updates), or None."""
  if ins.opcode == "dynamic-update-slice":
    return shape_bytes(fused.instructions[ins.operands[1]].shape)
  if ins.opcode == "scatter":  # (operands..., indices, updates...)
    updates = ins.operands[len(ins.operands) // 2 + 1:]
    return sum(shape_bytes(fused.instructions[u].shape) for u in updates)
  return None


def _unfused_bytes(comp: Computation, ins: Instruction) -> float:
  """Operands and result, but an async start counts all it returns too, a done the result,
  an async slice or in-place update what it moves (and its indices)."""
  op, target = ins.opcode, ins.target
  operands = [shape_bytes(comp.instructions[o].shape) for o in ins.operands]
  if op in _NO_DATA or target in _NO_DATA_CALLS:
    return 0.0
  if op.endswith("-done") or target == "ConcatBitcast":  # XLA:TPU's concatenation in place
    return shape_bytes(ins.shape)
  if op == "slice-start":  # ((operand), slice, flag)
    return 2 * array_bytes(*ARRAY.findall(ins.shape)[1])
  if op == "dynamic-update-slice":
    return 2 * operands[1] + sum(operands[2:])
  estimate = re.search(r'"cost_estimate":\{[^}]*"bytes_accessed":"?(\d+)', ins.attrs)
  return float(estimate.group(1)) if estimate else sum(operands) + shape_bytes(ins.shape)


_FLOPS, _BYTES, _COLLECTIVE, _KERNEL_RUNS = range(4)  # a tally's entries (a numpy vector)


class _Program:
  """The walk over a parsed module: each computation's cost once, loops multiplied in."""

  def __init__(self, hlo_text: str, dynamic_trips: int | None, kernel_shares: dict[str, float]):
    self.computations, self.entry = parse_module(hlo_text)
    self.dynamic_trips = dynamic_trips
    self.kernel_shares = kernel_shares
    self.costs: dict[str, tuple[np.ndarray, tuple[Loop, ...]]] = {}

  def cost(self, name: str) -> tuple[np.ndarray, tuple[Loop, ...]]:
    """A computation's tally and loops (depths relative to it), computed once."""
    if name not in self.costs:
      tally, loops, channels, comp = np.zeros(4), [], set(), self.computations[name]
      for ins in comp.instructions.values():
        loops += self.instruction(comp, ins, tally, channels)
      self.costs[name] = tally, tuple(loops)
    return self.costs[name]

  def instruction(self, comp, ins, tally: np.ndarray, channels: set) -> list[Loop]:
    """Adds an instruction of an unfused computation to `tally`; returns the loops in it."""
    if ins.opcode == "while":
      return self.loop(comp, ins, tally)
    if ins.opcode == "conditional":  # per figure, the costliest branch
      m = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
      branches = [self.cost(b) for b in (re.findall(r"[\w.\-]+", m[1].replace("%", "")) if m else [
          called(ins, "true_computation"), called(ins, "false_computation")])]
      tally += np.max([t for t, _ in branches], axis=0)
      return [loop for _, loops in branches for loop in loops]
    callee = called(ins, "calls") or (called(ins, "to_apply") if ins.opcode in (
        "call", "call-start", "async-start") else None)
    if callee and ins.opcode != "fusion":  # a call or an async computation: it runs
      body, loops = self.cost(callee)
      tally += body
      return list(loops)
    if ins.opcode == "fusion":
      tally += self.fusion(comp, ins, channels)
    else:
      tally += self.work(comp, ins, channels)
      tally[_BYTES] += _unfused_bytes(comp, ins) * self.share(ins)
    return []

  def work(self, comp, ins, channels: set) -> np.ndarray:
    """FLOPs, collective bytes, kernel runs of an instruction; a channel counts once."""
    tally, op = np.zeros(4), ins.opcode
    channel = re.search(r"channel_id=(\d+)", ins.attrs)
    if op.removesuffix("-start") in COLLECTIVES and not (channel and channel[1] in channels):
      channels.add(channel[1] if channel else None)
      operands = sum(shape_bytes(comp.instructions[o].shape) for o in ins.operands)
      # an all-gather's result (an async start returns its operands, then its results)
      tally[_COLLECTIVE] = (shape_bytes(ins.shape) - operands * op.endswith("-start")
                            if op.startswith("all-gather") else operands)
    elif op in ("dot", "convolution"):
      tally[_FLOPS] = (_dot_flops if op == "dot" else _convolution_flops)(comp, ins)
    elif ins.target in _KERNELS:
      estimate = re.search(r'"cost_estimate":\{"flops":"?(\d+)', ins.attrs)
      tally[_FLOPS if estimate else _KERNEL_RUNS] = (float(estimate[1]) * self.share(ins)
                                                    if estimate else 1)
    return tally

  def share(self, ins: Instruction) -> float:
    """The share of its cost estimate a custom kernel is counted at (`kernel_shares`)."""
    if ins.target not in _KERNELS or not self.kernel_shares:
      return 1.0
    return self.kernel_shares.get(re.sub(r"\.\d+$", "", ins.name), 1.0)

  def fused_work(self, comp: Computation, channels: set) -> np.ndarray:
    """The work inside a fused computation (no bytes: fused values stay out of memory)."""
    tally = np.zeros(4)
    for ins in comp.instructions.values():
      callee = called(ins, "calls") or (called(ins, "to_apply") if ins.opcode == "call" else None)
      tally += (self.fused_work(self.computations[callee], channels) if callee
                else self.work(comp, ins, channels))
    return tally

  def fusion(self, comp, ins, channels: set) -> np.ndarray:
    """The work inside, the bytes at the boundary; a fusion handing a collective to a custom
    call is an async start (operand and result) or done (result)."""
    fused = self.computations[called(ins, "calls")]
    tally, root = self.fused_work(fused, channels), fused.instructions[fused.root]
    if root.opcode == "custom-call" and fused.collective:
      arrays = ARRAY.findall(ins.shape)
      tally[_BYTES] = array_bytes(*arrays[-1 if len(arrays) == 1 else 1]) + (
          shape_bytes(comp.instructions[ins.operands[0]].shape) if len(arrays) > 1 else 0)
      return tally
    outputs = [fused.instructions[o] for o in root.operands] if root.opcode == "tuple" else [root]
    for out in outputs:  # a parameter passed through to the output is not written
      in_place = _in_place_bytes(fused, out)
      tally[_BYTES] += (0.0 if out.opcode == "parameter" else in_place if in_place is not None
                        else shape_bytes(out.shape if root.opcode == "tuple" else ins.shape))
    tally[_BYTES] += sum(self.read_bytes(fused, fused.params[k]) for k in range(len(ins.operands)))
    return tally

  def read_bytes(self, fused: Computation, name: str) -> float:
    """XLA's FusionParameterReadBytes: slices take their part, an update in place what it
    updates, other users share one read; handing the value on (root tuple, collective in
    flight) reads nothing."""
    root = fused.instructions[fused.root]
    outputs = root.operands if root.opcode == "tuple" else (root.name,)
    in_flight = root.opcode == "tuple" and fused.collective
    size, shared, full = 0.0, False, shape_bytes(fused.instructions[name].shape)
    for user in (u for u in fused.instructions.values() if name in u.operands):
      if user is root and root.opcode == "tuple" or in_flight and user.opcode in COLLECTIVES:
        continue
      if user.opcode == "fusion":
        inner = self.computations[called(user, "calls")]
        size += sum(self.read_bytes(inner, inner.params[k])
                    for k, o in enumerate(user.operands) if o == name)
      elif user.opcode == "slice" or (user.opcode in ("dynamic-slice", "gather")
                                      and user.operands[0] == name):
        size += shape_bytes(user.shape)
      elif user.name in outputs and user.operands[0] == name and user.opcode in (
          "dynamic-update-slice", "scatter"):  # the target of an update in place
        size += _in_place_bytes(fused, user) if user.opcode == "scatter" else 0.0
      elif user.opcode in ("broadcast", "reshape"):
        size += full
      elif not shared:
        size, shared = size + full, True
    return size

  def loop(self, comp, ins, tally: np.ndarray) -> list[Loop]:
    """A while loop: its body `trips` times, its condition once more."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', ins.attrs)
    trips = int(known[1]) if known else _counted_trips(self.computations, comp, ins)
    counted = trips is not None
    if not counted and self.dynamic_trips is None:
      raise ValueError(f"while loop {ins.name!r}: its condition {called(ins, 'condition')!r} "
                       "does not count up to a constant (its trips depend on data); pass "
                       "dynamic_trips, the trips to count (e.g. a decode loop's bound)")
    trips = trips if counted else self.dynamic_trips
    body, inner = self.cost(called(ins, "body"))
    tally += trips * body + (trips + 1) * self.cost(called(ins, "condition"))[0]
    return [Loop(ins.name, trips, counted, 0)] + [
        dataclasses.replace(loop, depth=loop.depth + 1) for loop in inner]


def _scalar(comp: Computation, name: str):
  """('constant', v), ('element', i, c): element i of the tuple parameter plus c, or None."""
  ins = comp.instructions[name]
  if ins.opcode in ("copy", "bitcast", "convert", "reshape"):
    return _scalar(comp, ins.operands[0])
  if ins.opcode == "constant" and re.fullmatch(r"-?\d+", ins.operand_text):
    return ("constant", int(ins.operand_text))
  if ins.opcode == "get-tuple-element" and comp.instructions[ins.operands[0]].opcode == "parameter":
    return ("element", int(re.search(r"index=(\d+)", ins.attrs)[1]), 0)
  if ins.opcode in ("add", "subtract"):
    a, b = (_scalar(comp, o) for o in ins.operands)
    if ins.opcode == "add" and a and a[0] == "constant":
      a, b = b, a
    if a and b and b[0] == "constant":
      return a[:-1] + (a[-1] + (b[1] if ins.opcode == "add" else -b[1]),)
  return None


def _counted_trips(computations, comp: Computation, ins: Instruction) -> int | None:
  """Trips of a loop whose condition compares a counter (an element its body steps by a
  constant, from a constant) with a constant; None for any other condition."""
  cond, body = (computations[called(ins, k)] for k in ("condition", "body"))
  init, update = comp.instructions[ins.operands[0]], body.instructions[body.root]
  compare = cond.instructions[cond.root]
  if compare.opcode != "compare" or init.opcode != "tuple" or update.opcode != "tuple":
    return None
  (lhs, rhs), direction = (_scalar(cond, o) for o in compare.operands), (
      re.search(r"direction=(\w+)", compare.attrs)[1])
  if lhs and lhs[0] == "constant":  # limit <direction> counter
    lhs, rhs, direction = rhs, lhs, {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(
        direction, direction)
  if not (lhs and rhs and lhs[0] == "element" and rhs[0] == "constant"):
    return None
  first, step = _scalar(comp, init.operands[lhs[1]]), _scalar(body, update.operands[lhs[1]])
  if not (first and first[0] == "constant" and step and step[:2] == ("element", lhs[1])
          and step[2] and direction in ("LT", "LE", "GT", "GE")):
    return None
  i, limit, step, up = first[1] + lhs[2], rhs[1], step[2], direction in ("LT", "LE")
  gap = (limit - i if up else i - limit) + (direction in ("LE", "GE"))  # trips if stepping 1
  if gap <= 0 or up != (step > 0):  # never entered, or counting away from the limit
    return 0 if gap <= 0 else None
  return -(-gap // abs(step))


def program_cost(hlo_text: str, dynamic_trips: int | None = None,
                 kernel_shares: dict[str, float] | None = None) -> ProgramCost:
  """Per-chip FLOPs and bytes of one run of a compiled program, its loops counted in full.

  Args:
    hlo_text: the optimized HLO module, `jax.jit(f).lower(...).compile().as_text()`.
    dynamic_trips: the trip count for each while loop whose condition is not a plain
      counter (a decode loop that stops early: pass its bound, for an upper bound).
    kernel_shares: kernel name (megablox's 'gmm') -> the share of its cost estimate, FLOPs
      and bytes, to count: for a kernel whose estimate assumes its whole static buffer is
      used (a grouped matmul's rows under expert parallelism, of which a device's own
      experts get E / ep on average).

  Returns:
    The program's ProgramCost.

  Raises:
    ValueError: naming the loop, if a loop's trips depend on data and dynamic_trips is None.
  """
  program = _Program(hlo_text, dynamic_trips, kernel_shares or {})
  tally, loops = program.cost(program.entry)
  return ProgramCost(flops=float(tally[_FLOPS]), bytes_accessed=float(tally[_BYTES]),
                     collective_bytes=float(tally[_COLLECTIVE]), loops=loops,
                     uncounted_kernels=float(tally[_KERNEL_RUNS]))
