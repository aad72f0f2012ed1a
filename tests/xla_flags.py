"""XLA_FLAGS for a test's subprocesses: the fake CPU device count, and XLA:CPU's elemental
emitters while JAX_DISABLE_MOST_OPTIMIZATIONS holds, as the test's own process compiles
(tests/conftest.py), so that a run in a subprocess and one in the test's process compile
alike and log the same numbers, bit for bit."""
import os

# XLA:CPU's option for its fusion emitters (off: the elemental ones, cheaper to compile).
FUSION_EMITTERS = "xla_cpu_use_fusion_emitters"


def for_devices(devices: int) -> str:
  flags = f"--xla_force_host_platform_device_count={devices}"
  if os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS", "").lower() in ("1", "true"):
    flags += f" --{FUSION_EMITTERS}=false"
  return flags
