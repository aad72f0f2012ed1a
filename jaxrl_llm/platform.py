"""Which hardware a program runs on, asked in one place.

Per-platform choices (the training attention kernel in `models.attention`, the decode
tuning table in `sampling`) read `of(mesh)`; nothing else looks at device kinds.
"""
from __future__ import annotations

import jax

PLATFORMS = ("cpu", "gpu", "tpu")


def device(mesh=None) -> jax.Device:
  """The first device of `mesh` (default: `jax.default_device`'s, or the default
  backend's first)."""
  if mesh is not None:
    return mesh.devices.flat[0]
  default = jax.config.jax_default_device
  return default if isinstance(default, jax.Device) else jax.devices()[0]


def of(mesh=None) -> str:
  """'cpu', 'gpu' or 'tpu': where the arrays of `mesh` (or the default devices) live."""
  return device_platform(device(mesh))


def device_platform(dev: jax.Device) -> str:
  """'cpu', 'gpu' or 'tpu': what kind of device `dev` is."""
  return "gpu" if dev.platform in ("gpu", "cuda", "rocm") else dev.platform


def compute_capability(mesh=None) -> tuple[int, int] | None:
  """An NVIDIA GPU's compute capability, e.g. (9, 0) for an H100/H200; None elsewhere."""
  capability = getattr(device(mesh), "compute_capability", None)
  if not capability:
    return None
  major, _, minor = str(capability).partition(".")
  return int(major), int(minor or 0)
