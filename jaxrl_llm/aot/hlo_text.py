"""Compiled HLO text (`compiled.as_text()`) parsed: computations, their instructions, the
called computations, and the bytes each array takes in memory with XLA:TPU's tiled layouts
(`hlo_cost` counts a program's work from them)."""
from __future__ import annotations

import dataclasses
import math
import re

# Bits per element; token and opaque values hold no data (f8/f4 variants: see array_bytes).
_BITS = {"pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16,
         "f16": 16, "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64,
         "f64": 64, "c64": 64, "c128": 128, "token": 0, "opaque": 0}
ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([^\]]*)\](\{[^}]*\})?")
_INSTRUCTION = re.compile(r"\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)", re.S)
_COMPUTATION = re.compile(r"(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
COLLECTIVES = {"all-gather", "all-reduce", "reduce-scatter", "all-to-all",
               "collective-permute", "ragged-all-to-all", "collective-broadcast"}


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  shape: str         # the result's shape, layouts included
  opcode: str
  operands: tuple[str, ...]
  operand_text: str  # inside the parentheses: names, or a constant's literal
  attrs: str         # after the parentheses
  target: str        # a custom call's target, else ""


@dataclasses.dataclass
class Computation:
  instructions: dict[str, Instruction]  # in program order
  params: dict[int, str]                # parameter number -> its instruction's name
  root: str = ""
  collective: bool = False              # holds a collective


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


def _parse_instruction(text: str) -> tuple[Instruction, bool] | None:
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
  return Instruction(m.group(2), shape, opcode, operands, inside, rest[close:], target[1] if (
      target and opcode == "custom-call") else ""), bool(m.group(1))


def parse_module(hlo_text: str) -> tuple[dict[str, Computation], str]:
  """HLO text -> ({computation name: computation}, the entry computation's name)."""
  computations, entry, current, lines = {}, None, None, iter(hlo_text.splitlines())
  for line in lines:
    if current is None:
      if m := _COMPUTATION.match(line):
        current = computations[m.group(2)] = Computation({}, {})
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
        current.collective |= ins.opcode in COLLECTIVES
        if ins.opcode == "parameter":
          current.params[int(ins.operand_text)] = ins.name
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text: expected compiled.as_text()")
  return computations, entry


def dimensions(dims_text: str) -> list[int]:
  """An array's sizes from its text ("4,<=128": dynamic sizes at their bound)."""
  return [int(d.lstrip("<=")) for d in dims_text.split(",") if d]


def array_bytes(dtype: str, dims_text: str, layout: str) -> float:
  """One array's bytes in memory: its layout's first tile pads the most minor dimensions."""
  bits = _BITS.get(dtype, 8 if dtype.startswith("f8") else 4 if dtype.startswith("f4") else None)
  if bits is None:
    raise ValueError(f"unknown element type {dtype!r}: expected one of {sorted(_BITS)}")
  dims, tile = dimensions(dims_text), re.search(r":[^T]*T\(([\d,]+)\)", layout)
  if tile:  # T(8,128): the two most minor dimensions (in layout order) to 8k and 128k
    major_to_minor = [dims[int(d)] for d in reversed(layout[1:layout.index(":")].split(",")) if d]
    sizes = [int(t) for t in tile.group(1).split(",")]
    dims = [1] * max(0, len(sizes) - len(major_to_minor)) + major_to_minor
    for i, t in enumerate(sizes, start=len(dims) - len(sizes)):
      dims[i] = -(-dims[i] // t) * t
  return math.prod(dims) * bits / 8


def shape_bytes(shape: str) -> float:
  """Bytes of a shape's arrays in memory (a tuple's summed)."""
  return sum(array_bytes(*array) for array in ARRAY.findall(shape))


def called(ins: Instruction, key: str) -> str | None:
  """The computation named by attribute `key` (calls, to_apply, body, condition...)."""
  m = re.search(rf"\b{key}=%?([\w.\-]+)", ins.attrs)
  return m.group(1) if m else None
