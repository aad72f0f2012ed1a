"""Running as several processes (hosts) under JAX's own runtime, `jax.distributed`.

One program serves one CPU, one GPU and a pod: every process runs the same trainer,
loads its own slice of the prompts and hands its rows to global arrays on one mesh
(see `training.loop`). This module joins the processes and holds the few host-side
collectives the trainer needs: concatenating per-process rows for metrics, and
agreeing on a shape or a decision (a prompt bucket, "stop: preempted").

With one process every function here is a no-op on its input.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

ENV_ADDRESS, ENV_COUNT, ENV_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"


def initialize(coordinator_address: str = "", num_processes: int | None = None,
               process_id: int | None = None, auto_detect: bool = False) -> bool:
  """Joins this process to the others with `jax.distributed.initialize`.

  Call it before anything touches a device. Arguments left empty fall back to the
  environment variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID.

  Args:
    coordinator_address: 'host:port' of process 0's coordinator service.
    num_processes: how many processes take part.
    process_id: this process's index, 0 .. num_processes - 1.
    auto_detect: with no address given, let JAX find the cluster itself (Cloud TPU
      pods, SLURM, Open MPI, Kubernetes).
  Returns:
    True when the process joined a multi-process run, False for a single process.
  """
  address = coordinator_address or os.environ.get(ENV_ADDRESS, "")
  if num_processes is None and os.environ.get(ENV_COUNT):
    num_processes = _env_int(ENV_COUNT)
  if process_id is None and os.environ.get(ENV_ID):
    process_id = _env_int(ENV_ID)
  if not address and not auto_detect:
    if num_processes not in (None, 1) or process_id not in (None, 0):
      raise ValueError(f"num_processes={num_processes}, process_id={process_id} without a "
                       f"coordinator address: set --coordinator_address or {ENV_ADDRESS}")
    return False
  if address:
    if num_processes is None or process_id is None:
      raise ValueError(f"coordinator address {address!r} given without the process count and "
                       f"index: set --num_processes/--process_id or {ENV_COUNT}/{ENV_ID}")
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(f"process_id={process_id}: expected 0 <= process_id < num_processes="
                       f"{num_processes}")
  # Collectives between CPU devices of different processes (no effect on GPU/TPU).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=address or None, num_processes=num_processes,
                             process_id=process_id)
  return True


def _env_int(name: str) -> int:
  value = os.environ[name]
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name}={value!r}: expected an integer") from None


def concat(tree):
  """Every process's host arrays (a pytree) concatenated along axis 0, in process order.

  One collective for the whole tree; every process gets the result.
  """
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, tree)
  return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def compiled_together(jitted, name: str):
  """`jitted`, run so that on several CPU processes each new argument signature is compiled
  ahead of its first run, and no process runs it before every process has compiled it.

  XLA:CPU joins processes' devices through gloo, whose reduce-scatter (an FSDP gradient's)
  gives up after 30 s, whatever the collective timeout is set to: a process that compiled
  the update faster than another would wait for it inside the collective and fail. Waiting
  at a barrier of the coordination service first keeps compile-time skew out of the
  collectives. Elsewhere (one process, GPU, TPU) `jitted` itself is returned.
  """
  if jax.process_count() == 1 or jax.devices()[0].platform != "cpu":
    return jitted
  compiled = set()

  def run(*args):
    leaves, tree = jax.tree.flatten(args)
    key = (tree, tuple((np.shape(x), getattr(x, "dtype", type(x)), getattr(x, "sharding", None))
                       for x in leaves))
    if key not in compiled:
      jitted.lower(*args).compile()  # jit's own cache keeps it: the call below reuses it
      barrier(f"{name}:{len(compiled)}")
      compiled.add(key)
    return jitted(*args)

  return run


def barrier(name: str, timeout_s: int = 3600) -> None:
  """Waits until every process has reached the barrier `name` (the coordination service's,
  no device program)."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  jax_distributed.global_state.client.wait_at_barrier(name, timeout_s * 1000)


def max_int(value: int) -> int:
  """The largest of the processes' `value`s."""
  return int(concat(np.asarray([value], np.int64)).max())


def sum_int(value: int) -> int:
  """The sum of the processes' `value`s."""
  return int(concat(np.asarray([value], np.int64)).sum())


def any_true(flag: bool) -> bool:
  """True if any process says True; the same answer on every process."""
  return max_int(int(bool(flag))) > 0


def all_true(flag: bool) -> bool:
  """True if every process says True; the same answer on every process."""
  return not any_true(not flag)


def gather_strings(texts: list[str]) -> list[str]:
  """Every process's strings concatenated in process order (two collectives: the byte
  lengths, then the bytes padded to the longest); every process gets the result."""
  if jax.process_count() == 1:
    return list(texts)
  data = [t.encode("utf-8") for t in texts]
  lengths = concat(np.asarray([len(d) for d in data], np.int64))
  width = max_int(max((len(d) for d in data), default=0))
  padded = np.zeros((len(data), max(width, 1)), np.uint8)
  for i, d in enumerate(data):
    padded[i, :len(d)] = np.frombuffer(d, np.uint8)
  rows = concat(padded)
  return [bytes(row[:n]).decode("utf-8") for row, n in zip(rows, lengths)]


def local_rows(tree):
  """Global arrays (a pytree) -> the rows this process's devices hold, as numpy.

  For a batch placed with `put_process_rows` (and what a program computes from it row by
  row, such as the sampler's outputs) those are this process's own rows. Read from the
  process's own shards: no collective, so a thread may call it while another runs programs.
  With one process: the whole arrays.
  """
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return jax.tree.map(_own_rows, tree)


def _own_rows(x):
  """The rows of `x` this process's shards hold, each whole (other axes unsplit)."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(x)
  shards = {}
  for shard in x.addressable_shards:
    rows = shard.index[0] if shard.index else slice(None)
    start, stop, _ = rows.indices(x.shape[0])
    if any(i.indices(n)[:2] != (0, n) for i, n in zip(shard.index[1:], x.shape[1:])):
      raise ValueError(f"an array of shape {x.shape} sharded as {x.sharding.spec} is split "
                       "along a dimension other than its rows: expected whole rows per device")
    shards.setdefault((start, stop), shard)
  spans = sorted(shards)
  if any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
    raise ValueError(f"this process's rows of an array of shape {x.shape} are not contiguous "
                     f"({spans}): expected its devices to hold one block of rows")
  return np.concatenate([np.asarray(shards[span].data) for span in spans])
