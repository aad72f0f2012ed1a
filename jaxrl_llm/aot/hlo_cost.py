"""FLOPs and bytes of a compiled program, every while loop counted as often as it runs.

XLA's `compiled.cost_analysis()` counts a loop's body once, and our programs are loops:
layers, micro-batches, chunked log-probs, the decode `while_loop`. `program_cost(
compiled.as_text())` multiplies each body by its trip count (nested loops multiply; a
condition runs once more than its body). Figures are per chip and follow HloCostAnalysis as
XLA:TPU applies it: with its loops run once, a program gets XLA's figures (tests/aot/):
  flops: 2 per multiply-add of dots and convolutions (padded or dilated taps skipped) and a
    Pallas kernel's `cost_estimate`; not elementwise ops (XLA counts one per element of
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

# Bits per element; token and opaque values hold no data (f8/f4 variants: see _array_bytes).
_BITS = {"pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16,
         "f16": 16, "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64,
         "f64": 64, "c64": 64, "c128": 128, "token": 0, "opaque": 0}
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([^\]]*)\](\{[^}]*\})?")
_INSTRUCTION = re.compile(r"\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)", re.S)
_COMPUTATION = re.compile(r"(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_NO_DATA = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
            "partition-id", "replica-id", "add-dependency", "opt-barrier", "domain",
            "slice-done", "call-done", "async-done"}  # the last: their start counted it all
_COLLECTIVES = {"all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                "collective-permute", "ragged-all-to-all", "collective-broadcast"}
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


@dataclasses.dataclass(frozen=True)
class _Instruction:
  name: str
  shape: str         # the result's shape, layouts included
  opcode: str
  operands: tuple[str, ...]
  operand_text: str  # inside the parentheses: names, or a constant's literal
  attrs: str         # after the parentheses
  target: str        # a custom call's target, else ""


@dataclasses.dataclass
class _Computation:
  instructions: dict[str, _Instruction]  # in program order
  params: dict[int, str]                 # parameter number -> its instruction's name
  root: str = ""
  collective: bool = False               # holds a collective


def _bracket_end(text: str, start: int = 0) -> int:
  """Past the bracket closing text[start]'s; from a line's start, -1 if brackets stay open."""
  depth, quoted, escaped = 0, False, False
  for i in range(start, len(text)):
    c = text[i]
    if quoted:
      quoted, escaped = c != '"' or escaped, c == "\\" and not escaped
    elif c in "({[)}]":
      depth += 1 if c in "({[" else -1
      if depth == 0 and text[start] in "({[":
        return i + 1
    else:
      quoted = c == '"'
  return len(text) if depth == 0 else -1


def _parse_instruction(text: str) -> tuple[_Instruction, bool] | None:
  """`[ROOT] %name = SHAPE opcode(operands), attrs` -> (instruction, is the root)."""
  if not (m := _INSTRUCTION.match(text)):
    return None
  rest = m.group(3)
  end = _bracket_end(rest) if rest.startswith("(") else rest.index(" ")
  shape, rest = rest[:end], rest[end:].lstrip()
  opcode, close = rest[:rest.index("(")], _bracket_end(rest, rest.index("("))
  inside = rest[len(opcode) + 1:close - 1]
  operands = () if opcode == "constant" else tuple(re.findall(r"%([\w.\-]+)", inside))
  target = re.search(r'custom_call_target="([^"]*)"', rest[close:])
  return _Instruction(m.group(2), shape, opcode, operands, inside, rest[close:], target[1] if (
      target and opcode == "custom-call") else ""), bool(m.group(1))


def parse_module(hlo_text: str) -> tuple[dict[str, _Computation], str]:
  """HLO text -> ({computation name: computation}, the entry computation's name)."""
  computations, entry, current, lines = {}, None, None, iter(hlo_text.splitlines())
  for line in lines:
    if current is None:
      if m := _COMPUTATION.match(line):
        current = computations[m.group(2)] = _Computation({}, {})
        entry = m.group(2) if m.group(1) else entry
    elif line.startswith("}"):  # "}" or "}, execution_thread=..."
      current = None
    elif line.strip():
      while _bracket_end(line) < 0:  # an attribute (a kernel's metadata) spans lines
        line += "\n" + next(lines)
      parsed = _parse_instruction(line)
      if parsed:
        ins, current.root = parsed[0], parsed[0].name if parsed[1] else current.root
        current.instructions[ins.name] = ins
        current.collective |= ins.opcode in _COLLECTIVES
        if ins.opcode == "parameter":
          current.params[int(ins.operand_text)] = ins.name
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text: expected compiled.as_text()")
  return computations, entry


def _dims(dims_text: str) -> list[int]:
  return [int(d.lstrip("<=")) for d in dims_text.split(",") if d]


def _array_bytes(dtype: str, dims_text: str, layout: str) -> float:
  """One array's bytes in memory: its layout's first tile pads the most minor dimensions."""
  bits = _BITS.get(dtype, 8 if dtype.startswith("f8") else 4 if dtype.startswith("f4") else None)
  if bits is None:
    raise ValueError(f"unknown element type {dtype!r}: expected one of {sorted(_BITS)}")
  dims, tile = _dims(dims_text), re.search(r":[^T]*T\(([\d,]+)\)", layout)
  if tile:  # T(8,128): the two most minor dimensions (in layout order) to 8k and 128k
    major_to_minor = [dims[int(d)] for d in reversed(layout[1:layout.index(":")].split(",")) if d]
    sizes = [int(t) for t in tile.group(1).split(",")]
    dims = [1] * max(0, len(sizes) - len(major_to_minor)) + major_to_minor
    for i, t in enumerate(sizes, start=len(dims) - len(sizes)):
      dims[i] = -(-dims[i] // t) * t
  return math.prod(dims) * bits / 8


def shape_bytes(shape: str) -> float:
  """Bytes of a shape's arrays in memory (a tuple's summed)."""
  return sum(_array_bytes(*array) for array in _ARRAY.findall(shape))


def _called(ins: _Instruction, key: str) -> str | None:
  """The computation named by attribute `key` (calls, to_apply, body, condition...)."""
  m = re.search(rf"\b{key}=%?([\w.\-]+)", ins.attrs)
  return m.group(1) if m else None


def _dot_flops(comp: _Computation, ins: _Instruction) -> float:
  """2 x result elements x the contracted size of the left operand."""
  lhs = _dims(_ARRAY.search(comp.instructions[ins.operands[0]].shape).group(2))
  m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attrs)
  contracted = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m else 1
  return 2.0 * math.prod(_dims(_ARRAY.search(ins.shape).group(2))) * contracted


def _convolution_flops(comp: _Computation, ins: _Instruction) -> float:
  """2 x in features / feature groups x out features x batch / batch groups x, for each
  spatial dimension, the (kernel tap, output) pairs that read input, not padding or a hole
  of lhs dilation (XLA's GetConvolutionFlops)."""
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attrs)
  if labels is None:
    raise ValueError(f"convolution {ins.name}: no dim_labels, expected e.g. b01f_01io->b01f")
  shapes = [comp.instructions[o].shape for o in ins.operands[:2]] + [ins.shape]
  # label -> size: lhs["f"] input features, rhs["0"] kernel taps of spatial dimension 0...
  lhs, rhs, out = (dict(zip(label, _dims(_ARRAY.search(shape).group(2))))
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


def _in_place_bytes(fused: _Computation, ins: _Instruction) -> float | None:
  """What an update in place writes (a dynamic-update-slice's or scatter's updates), or None."""
  if ins.opcode == "dynamic-update-slice":
    return shape_bytes(fused.instructions[ins.operands[1]].shape)
  if ins.opcode == "scatter":  # (operands..., indices, updates...)
    updates = ins.operands[len(ins.operands) // 2 + 1:]
    return sum(shape_bytes(fused.instructions[u].shape) for u in updates)
  return None


def _unfused_bytes(comp: _Computation, ins: _Instruction) -> float:
  """Operands and result, but an async start counts all it returns too, a done the result,
  an async slice or in-place update what it moves (and its indices)."""
  op, target = ins.opcode, ins.target
  operands = [shape_bytes(comp.instructions[o].shape) for o in ins.operands]
  if op in _NO_DATA or target in _NO_DATA_CALLS:
    return 0.0
  if op.endswith("-done") or target == "ConcatBitcast":  # XLA:TPU's concatenation in place
    return shape_bytes(ins.shape)
  if op == "slice-start":  # ((operand), slice, flag)
    return 2 * _array_bytes(*_ARRAY.findall(ins.shape)[1])
  if op == "dynamic-update-slice":
    return 2 * operands[1] + sum(operands[2:])
  estimate = re.search(r'"cost_estimate":\{[^}]*"bytes_accessed":"?(\d+)', ins.attrs)
  return float(estimate.group(1)) if estimate else sum(operands) + shape_bytes(ins.shape)


_FLOPS, _BYTES, _COLLECTIVE, _KERNEL_RUNS = range(4)  # a tally's entries (a numpy vector)


class _Program:
  """The walk over a parsed module: each computation's cost once, loops multiplied in."""

  def __init__(self, hlo_text: str, dynamic_trips: int | None):
    self.computations, self.entry = parse_module(hlo_text)
    self.dynamic_trips = dynamic_trips
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
          _called(ins, "true_computation"), _called(ins, "false_computation")])]
      tally += np.max([t for t, _ in branches], axis=0)
      return [loop for _, loops in branches for loop in loops]
    called = _called(ins, "calls") or (_called(ins, "to_apply") if ins.opcode in (
        "call", "call-start", "async-start") else None)
    if called and ins.opcode != "fusion":  # a call or an async computation: it runs
      body, loops = self.cost(called)
      tally += body
      return list(loops)
    if ins.opcode == "fusion":
      tally += self.fusion(comp, ins, channels)
    else:
      tally += self.work(comp, ins, channels)
      tally[_BYTES] += _unfused_bytes(comp, ins)
    return []

  def work(self, comp, ins, channels: set) -> np.ndarray:
    """FLOPs, collective bytes, kernel runs of an instruction; a channel counts once."""
    tally, op = np.zeros(4), ins.opcode
    channel = re.search(r"channel_id=(\d+)", ins.attrs)
    if op.removesuffix("-start") in _COLLECTIVES and not (channel and channel[1] in channels):
      channels.add(channel[1] if channel else None)
      operands = sum(shape_bytes(comp.instructions[o].shape) for o in ins.operands)
      # an all-gather's result (an async start returns its operands, then its results)
      tally[_COLLECTIVE] = (shape_bytes(ins.shape) - operands * op.endswith("-start")
                            if op.startswith("all-gather") else operands)
    elif op in ("dot", "convolution"):
      tally[_FLOPS] = (_dot_flops if op == "dot" else _convolution_flops)(comp, ins)
    elif ins.target in _KERNELS:
      estimate = re.search(r'"cost_estimate":\{"flops":"?(\d+)', ins.attrs)
      tally[_FLOPS if estimate else _KERNEL_RUNS] = float(estimate[1]) if estimate else 1
    return tally

  def fused_work(self, comp: _Computation, channels: set) -> np.ndarray:
    """The work inside a fused computation (no bytes: fused values stay out of memory)."""
    tally = np.zeros(4)
    for ins in comp.instructions.values():
      called = _called(ins, "calls") or (_called(ins, "to_apply") if ins.opcode == "call" else None)
      tally += (self.fused_work(self.computations[called], channels) if called
                else self.work(comp, ins, channels))
    return tally

  def fusion(self, comp, ins, channels: set) -> np.ndarray:
    """The work inside, the bytes at the boundary; a fusion handing a collective to a custom
    call is an async start (operand and result) or done (result)."""
    fused = self.computations[_called(ins, "calls")]
    tally, root = self.fused_work(fused, channels), fused.instructions[fused.root]
    if root.opcode == "custom-call" and fused.collective:
      arrays = _ARRAY.findall(ins.shape)
      tally[_BYTES] = _array_bytes(*arrays[-1 if len(arrays) == 1 else 1]) + (
          shape_bytes(comp.instructions[ins.operands[0]].shape) if len(arrays) > 1 else 0)
      return tally
    outputs = [fused.instructions[o] for o in root.operands] if root.opcode == "tuple" else [root]
    for out in outputs:  # a parameter passed through to the output is not written
      in_place = _in_place_bytes(fused, out)
      tally[_BYTES] += (0.0 if out.opcode == "parameter" else in_place if in_place is not None
                        else shape_bytes(out.shape if root.opcode == "tuple" else ins.shape))
    tally[_BYTES] += sum(self.read_bytes(fused, fused.params[k]) for k in range(len(ins.operands)))
    return tally

  def read_bytes(self, fused: _Computation, name: str) -> float:
    """XLA's FusionParameterReadBytes: slices take their part, an update in place what it
    updates, other users share one read; handing the value on (root tuple, collective in
    flight) reads nothing."""
    root = fused.instructions[fused.root]
    outputs = root.operands if root.opcode == "tuple" else (root.name,)
    in_flight = root.opcode == "tuple" and fused.collective
    size, shared, full = 0.0, False, shape_bytes(fused.instructions[name].shape)
    for user in (u for u in fused.instructions.values() if name in u.operands):
      if user is root and root.opcode == "tuple" or in_flight and user.opcode in _COLLECTIVES:
        continue
      if user.opcode == "fusion":
        inner = self.computations[_called(user, "calls")]
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
      raise ValueError(f"while loop {ins.name!r}: its condition {_called(ins, 'condition')!r} "
                       "does not count up to a constant (its trips depend on data); pass "
                       "dynamic_trips, the trips to count (e.g. a decode loop's bound)")
    trips = trips if counted else self.dynamic_trips
    body, inner = self.cost(_called(ins, "body"))
    tally += trips * body + (trips + 1) * self.cost(_called(ins, "condition"))[0]
    return [Loop(ins.name, trips, counted, 0)] + [
        dataclasses.replace(loop, depth=loop.depth + 1) for loop in inner]


def _scalar(comp: _Computation, name: str):
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


def _counted_trips(computations, comp: _Computation, ins: _Instruction) -> int | None:
  """Trips of a loop whose condition compares a counter (an element its body steps by a
  constant, from a constant) with a constant; None for any other condition."""
  cond, body = (computations[_called(ins, k)] for k in ("condition", "body"))
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


def program_cost(hlo_text: str, dynamic_trips: int | None = None) -> ProgramCost:
  """Per-chip FLOPs and bytes of one run of a compiled program, its loops counted in full.

  Args:
    hlo_text: the optimized HLO module, `jax.jit(f).lower(...).compile().as_text()`.
    dynamic_trips: the trip count for each while loop whose condition is not a plain
      counter (a decode loop that stops early: pass its bound, for an upper bound).

  Returns:
    The program's ProgramCost.

  Raises:
    ValueError: naming the loop, if a loop's trips depend on data and dynamic_trips is None.
  """
  program = _Program(hlo_text, dynamic_trips)
  tally, loops = program.cost(program.entry)
  return ProgramCost(flops=float(tally[_FLOPS]), bytes_accessed=float(tally[_BYTES]),
                     collective_bytes=float(tally[_COLLECTIVE]), loops=loops,
                     uncounted_kernels=float(tally[_KERNEL_RUNS]))
