"""TPU slices on any host: a topology name -> the slice's devices, and what one chip can do.

`topology_devices('v5p:2x2x4')` asks libtpu (`pip install "jax[tpu]"`, no TPU needed) for
the devices of that slice, as `jax.experimental.topologies` describes them: the real chip
coordinates and hosts, so a mesh laid over them and a program compiled for them are what
the slice would run. `num_slices=2` gives two such slices joined by the data-center
network (multislice).

`slice_chips('v5p:2x2x4')` needs no libtpu: one stand-in per chip, for checks that only
lay a mesh over the slice (a training config's dry run, `jaxrl-llm-train --dry_run`).

`CHIPS` holds one chip's figures per generation, each from Google's data sheet for it (the
`source`), except `hbm_bytes`: the HBM that XLA:TPU itself lets a program use, read from
the compiler's out-of-memory message (a program that asks for more fails to compile with
"exceeds available HBM (15.75G)" on v5e; tests/aot/chips_test.py checks the table
against the compiler). v4's compile-only topology has one device per TensorCore (two per
chip, no megacore), so its row is per TensorCore.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One device of a TPU generation.

  Attributes:
    name: the generation as topology names spell it ('v5e').
    device_kind: `jax.Device.device_kind` of its devices ('TPU v5 lite').
    peak_flops: dense bf16 FLOP/s.
    hbm_bytes: HBM a program may use, as XLA:TPU counts it.
    hbm_bandwidth: HBM bytes per second.
    ici_bandwidth: inter-chip interconnect bytes per second (bidirectional, per chip).
    source: the data sheet the peak and bandwidths come from.
  """
  name: str
  device_kind: str
  peak_flops: float
  hbm_bytes: int
  hbm_bandwidth: float
  ici_bandwidth: float
  source: str


CHIPS = {
    "v4": Chip("v4", "TPU v4", 275e12 / 2, int(15.25 * GIB), 1200e9 / 2, 2400e9 / 8 / 2,
               "https://cloud.google.com/tpu/docs/v4 (per chip: 275 TFLOP/s, 32 GiB, "
               "1200 GB/s; halved per TensorCore)"),
    "v5e": Chip("v5e", "TPU v5 lite", 197e12, int(15.75 * GIB), 819e9, 400e9,
                "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("v5p", "TPU v5", 459e12, int(95.74 * GIB), 2765e9, 1200e9,
                "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("v6e", "TPU v6 lite", 918e12, int(31.25 * GIB), 1638e9, 800e9,
                "https://cloud.google.com/tpu/docs/v6e"),
}
_NAME = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(x\d+){1,2})$")


class TopologyError(ValueError):
  """A topology name, slice count or mesh that does not describe a TPU slice."""


def _quiet_libtpu() -> None:
  """Settings for libtpu as a compiler only. It looks for the TPU VM it runs on and prints
  warnings when there is none (these values, set by the VM on one, keep the output clean),
  and by default one process at a time may load it (a lock file): compiling claims no
  chip, so several may."""
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _check_name(name: str, num_slices: int, fields: tuple[str, str]) -> None:
  """`fields`: how the caller names the two settings ('--topology', '--num_slices')."""
  if not isinstance(name, str) or not _NAME.match(name):
    raise TopologyError(f"{fields[0]}={name!r}: expected GENERATION:SHAPE with a generation of "
                        f"{', '.join(CHIPS)} and a shape such as 2x4 or 2x2x4 (e.g. v5e:2x4, "
                        "v5p:2x2x4)")
  if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
    raise TopologyError(f"{fields[1]}={num_slices!r}: expected 1 or more")


def topology_devices(name: str, num_slices: int = 1) -> list:
  """The devices of `num_slices` slices of topology `name` (e.g. 'v5e:2x4', 'v5p:4x4x4').

  Raises:
    TopologyError: an unknown generation or shape, or libtpu missing, in one line.
  """
  _check_name(name, num_slices, ("--topology", "--num_slices"))
  if importlib.util.find_spec("libtpu") is None and not os.environ.get("TPU_LIBRARY_PATH"):
    raise TopologyError("the TPU compiler (libtpu) is not installed: pip install \"jax[tpu]\" "
                        "(the version matching jax), or pip install -e '.[tpu]'")
  _quiet_libtpu()
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    desc = topologies.get_topology_desc(platform="tpu", topology_name=name, num_slices=num_slices)
  except RuntimeError as e:  # jax.errors.JaxRuntimeError: libtpu refused the shape
    message = " ".join(str(e).split()).removeprefix("INVALID_ARGUMENT: ")
    raise TopologyError(f"--topology={name!r}: {message}") from e
  return list(desc.devices)


@dataclasses.dataclass(frozen=True)
class SliceChip:
  """One chip of a slice named by its topology, standing in for its device where only a
  mesh is laid over the slice: what `jax.sharding.Mesh` and `mesh_utils` read of a TPU
  device (its id, coordinates and slice)."""
  id: int
  coords: tuple[int, int, int]
  slice_index: int
  device_kind: str
  process_index: int = 0  # the hosts are not modelled
  core_on_chip: int = 0
  platform: str = "tpu"


def slice_chips(name: str, num_slices: int = 1,
                fields: tuple[str, str] = ("--topology", "--num_slices")) -> list[SliceChip]:
  """A stand-in per chip of `num_slices` slices of topology `name`, without libtpu: one
  device per chip, as a training run sees them (a v4 chip's two TensorCores are one
  megacore device; `topology_devices` gives the compiler's two).

  Raises:
    TopologyError: an unknown generation or shape, naming `fields` (the caller's names of
      the two settings, e.g. ('config.mesh.topology', 'config.mesh.num_slices')).
  """
  _check_name(name, num_slices, fields)
  generation, shape = name.split(":")
  dims = [int(d) for d in shape.split("x")] + [1]
  x, y, z = dims[:3]
  kind = CHIPS[generation].device_kind
  return [SliceChip(s * x * y * z + i, (i % x, i // x % y, i // (x * y)), s, kind)
          for s in range(num_slices) for i in range(x * y * z)]


def chip_of(devices) -> Chip:
  """The `CHIPS` row of `devices` (TPU devices of one generation)."""
  kind = devices[0].device_kind
  for chip in CHIPS.values():
    if chip.device_kind == kind:
      return chip
  raise TopologyError(f"devices of kind {kind!r}: expected TPU devices of one of "
                      f"{', '.join(c.device_kind for c in CHIPS.values())}")


def describe(devices) -> str:
  """'16 TPU v5 chips on 4 hosts' (with ', 2 slices' for multislice)."""
  hosts = len({d.process_index for d in devices})
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  where = f"{len(devices)} {devices[0].device_kind} devices on {hosts} host{'s' * (hosts > 1)}"
  return where + (f", {slices} slices" if slices > 1 else "")
