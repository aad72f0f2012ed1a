"""XLA_FLAGS for a test's subprocesses: this process's (tests/conftest.py: the fake CPU
device count and, while JAX_DISABLE_MOST_OPTIMIZATIONS holds and XLA has the options,
`CHEAPEST_CPU_CODEGEN`, as the test's own process compiles), with another device count, so
that a run in a subprocess and one in the test's process compile alike and log the same
numbers, bit for bit."""
import os

# XLA:CPU's cheapest code generation for the tests' tiny programs: its elemental emitters
# rather than its fusion emitters, and each program's LLVM IR as one module rather than
# split for a pool of threads that two busy cores cannot run in parallel. Neither changes
# what a program computes. CPU seconds to compile the steps' programs of a tiny model (its
# sampler, prepare and update), best of 3: 6.0 -> 2.2 (elemental) -> 1.7 (one module).
CHEAPEST_CPU_CODEGEN = {"xla_cpu_use_fusion_emitters": False,
                        "xla_cpu_parallel_codegen_split_count": 1}
DEVICE_COUNT = "xla_force_host_platform_device_count"  # XLA:CPU's fake devices


def as_flags(options: dict) -> str:
  return " ".join(f"--{name}={str(value).lower()}" for name, value in options.items())


def _without(flags: str, names) -> list[str]:
  """The flags of `flags` not named in `names`."""
  return [f for f in flags.split() if f.split("=", 1)[0].lstrip("-") not in names]


def without_cheapest_codegen(flags: str) -> str:
  """`flags` less `CHEAPEST_CPU_CODEGEN`'s (as a test process inherits them from pytest's
  controller: its own compiles take them per compile, the `optimized` ones not at all)."""
  return " ".join(_without(flags, CHEAPEST_CPU_CODEGEN))


def for_devices(devices: int) -> str:
  return " ".join([f"--{DEVICE_COUNT}={devices}",
                   *_without(os.environ.get("XLA_FLAGS", ""), {DEVICE_COUNT})])
