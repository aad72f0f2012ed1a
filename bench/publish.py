"""Weight publish: from trained parameters that are ready to the sampler's copy of them ready.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python bench/publish.py
  .venv/bin/python bench/publish.py --processes=2 --devices=8 --rollout_devices=4

What the trainer issues after each update with asynchronous rollouts
(`Models.sampler_copy`, which `Feed.publish` calls): the trained parameters cast to the
compute dtype and placed where the sampler keeps them. Two placements, on the first
`--devices` devices (over every process's, with `--processes=N`: N local processes joined
by `jax.distributed`, each with devices / N CPU devices):
  shared: one mesh for the trainer and the sampler; the copy is the cast, on the same devices;
  split:  the sampler on `--rollout_devices` devices of its own (tensor-parallel; with several
          processes, rollout_devices / N in each, data-parallel over the processes), the
          trainer on the rest. Across processes `sharding.transfer` first spreads each array
          over every process's trainer devices (one copy per process, split over its devices),
          then each process copies its sampler's pieces from there.
The trainer's mesh is FSDP over its devices (data 1, fsdp -1), the layout of a model too
large to replicate. The workload's model is `--shape` (bench/train_step.py's). Printed per
placement: the median of `--steps` copies after one that compiles, the bytes of the copy,
and, with split placement across processes, the bytes one trainer device holds for the
staging against a whole copy (what the transfer held before it moved shards). The last line
is JSON, after 'RESULT '.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

import train_step  # noqa: E402  (its flags: --shape, --steps)

_DEVICES = flags.DEFINE_integer("devices", 8, "devices the copies use (the first N, all processes')")
_ROLLOUT_DEVICES = flags.DEFINE_integer("rollout_devices", 4, "the sampler's devices (split)")
_PLACEMENTS = flags.DEFINE_list("placements", ["shared", "split"], "which placements, in order")
_PROCESSES = flags.DEFINE_integer("processes", 1, "local processes joined by jax.distributed")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "set by the launcher (internal)")
_ADDRESS = flags.DEFINE_string("coordinator_address", "", "set by the launcher (internal)")


def publish(placement: str, tmp: str) -> dict:
  """Seconds from ready trained parameters to the sampler's copy of them ready."""
  import jax
  import numpy as np
  from jaxrl_llm import config as config_lib
  from jaxrl_llm import sharding as sh
  from jaxrl_llm import training
  from jaxrl_llm.training import setup as setup_lib
  config = train_step.workload(tmp, train_step._SHAPE.value)
  config.algo.max_async_level = 1
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, -1, 1
  config.mesh.rollout_devices = _ROLLOUT_DEVICES.value if placement == "split" else 0
  devices = jax.devices()[:_DEVICES.value]
  config_lib.validate(config, devices)
  setup = training.set_up(config, training.make_plan(config), devices)
  params = jax.block_until_ready(setup_lib.fresh_state(setup, 0).policy_params)
  times = []
  for _ in range(1 + train_step._STEPS.value):
    t = time.perf_counter()
    copy = jax.block_until_ready(setup.models.sampler_copy(params))
    times.append(time.perf_counter() - t)
  copied = jax.tree.leaves(copy)  # in the compute dtype: what the transfer moves
  nbytes = lambda shape, x: int(np.prod(shape)) * x.dtype.itemsize
  out = {"placement": placement, "publish_s": statistics.median(times[1:]),
         "first_s": times[0], "copy_bytes": sum(nbytes(x.shape, x) for x in copied)}
  if placement == "split" and jax.process_count() > 1:
    staging = sh.staging_shardings(jax.tree.leaves(params))
    out["staged_bytes_per_device"] = sum(nbytes(s.shard_shape(x.shape), x)
                                         for x, s in zip(copied, staging))
    out["whole_bytes"] = out["copy_bytes"]
  return out


def launch_processes() -> int:
  """Runs this script as `--processes` local processes; prints process 0's output."""
  with socket.socket() as s:  # a free port for process 0's coordinator
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
  per = _DEVICES.value // _PROCESSES.value
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={per}")
  procs = [subprocess.Popen([sys.executable, *sys.argv, f"--process_id={i}",
                             f"--coordinator_address={address}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(_PROCESSES.value)]
  outputs = [p.communicate()[0] for p in procs]
  for i, (p, out) in enumerate(zip(procs, outputs)):
    if p.returncode:
      print(f"process {i} failed:\n{out[-4000:]}")
      return p.returncode
  print("\n".join(line for line in outputs[0].splitlines()
                  if line.startswith(("shared", "split", "RESULT"))))
  return 0


def main(argv):
  del argv
  if _PROCESSES.value > 1 and _PROCESS_ID.value is None:
    sys.exit(launch_processes())
  import jax
  from jaxrl_llm import distributed
  if _PROCESS_ID.value is not None:
    distributed.initialize(_ADDRESS.value, _PROCESSES.value, _PROCESS_ID.value)
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    for placement in _PLACEMENTS.value:
      r = publish(placement, tmp)
      results.append(r)
      staged = ("" if "whole_bytes" not in r else f"; staging per trainer device "
                f"{r['staged_bytes_per_device'] / 2**20:.1f} MiB (a whole copy: "
                f"{r['whole_bytes'] / 2**20:.1f} MiB)")
      print(f"{placement:7s} {1e3 * r['publish_s']:.1f} ms (first {r['first_s']:.2f} s) for "
            f"{r['copy_bytes'] / 2**20:.1f} MiB{staged}", flush=True)
  print("RESULT " + json.dumps({"devices": _DEVICES.value, "processes": jax.process_count(),
                                "platform": jax.devices()[0].platform,
                                "rollout_devices": _ROLLOUT_DEVICES.value, "results": results}))


if __name__ == "__main__":
  app.run(main)
