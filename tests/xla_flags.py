"""XLA_FLAGS for a test's subprocesses: this process's (tests/conftest.py: the fake CPU
device count and, while JAX_DISABLE_MOST_OPTIMIZATIONS holds and XLA has the option,
XLA:CPU's elemental emitters, as the test's own process compiles), with another device
count, so that a run in a subprocess and one in the test's process compile alike and log the
same numbers, bit for bit."""
import os
import re

# XLA:CPU's option for its fusion emitters (off: the elemental ones, cheaper to compile).
FUSION_EMITTERS = "xla_cpu_use_fusion_emitters"
_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def for_devices(devices: int) -> str:
  others = re.sub(rf"{_DEVICE_COUNT}=\S+", "", os.environ.get("XLA_FLAGS", "")).split()
  return " ".join([f"{_DEVICE_COUNT}={devices}", *others])
