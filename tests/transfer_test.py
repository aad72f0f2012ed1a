"""`sharding.transfer` between a trainer mesh and a sampler mesh spanning 2 processes:
every piece arrives exact, and the staging holds one copy per process split over its
devices (the shards, not a whole copy per device)."""
import json
import os
import subprocess
import sys

from absl.testing import absltest

from tests import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {"fsdp_rows": ((8, 6), "float32"), "odd_rows": ((5, 6), "float32"),
          "odd": ((3,), "float32"), "bf16": ((16, 4), "bfloat16"), "interleaved": ((8, 2), "float32")}


def worker(address: str, process_id: int) -> dict:
  """One process of two, 4 CPU devices each: split placement as training makes it (the
  sampler 2 devices per process, tensor-parallel; the trainer the other 4, fsdp)."""
  import jax
  import ml_collections
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from jaxrl_llm import distributed
  from jaxrl_llm import sharding as sh
  distributed.initialize(address, 2, process_id)
  trainer, sampler = sh.split_meshes(ml_collections.ConfigDict(
      dict(data=1, fsdp=-1, tensor=1, rollout_devices=4)))
  wants = {name: np.arange(np.prod(shape), dtype=np.float32).reshape(shape).astype(jax.numpy.dtype(dtype))
           for name, (shape, dtype) in SHAPES.items()}
  sources = {name: NamedSharding(trainer, P() if name in ("odd_rows", "odd") else P("fsdp"))
             for name in SHAPES}
  targets = {name: NamedSharding(sampler, P(None, "tensor") if name == "fsdp_rows" else P())
             for name in SHAPES}
  # A target whose devices of one process are not a block of its mesh (0, 2 of 4 rows).
  alternate = sorted(sampler.devices.flat, key=lambda d: (d.id % 4, d.process_index))
  targets["interleaved"] = NamedSharding(Mesh(np.asarray(alternate), ("x",)), P("x"))
  # The whole array on this process's first device (what the episode players run).
  targets["odd"] = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  tree = {name: jax.make_array_from_callback(w.shape, sources[name], lambda i, w=w: w[i])
          for name, w in wants.items()}
  out = jax.block_until_ready(sh.transfer(tree, targets))
  exact = all(np.array_equal(np.asarray(s.data, np.float32), wants[name][s.index].astype(np.float32))
              for name, x in out.items() for s in x.addressable_shards)
  layouts = {name: x.sharding == targets[name] for name, x in out.items()}
  staging = sh.staging_shardings(list(tree.values()))
  per_device = {name: list(s.shard_shape(tree[name].shape))
                for name, s in zip(tree, staging)}
  whole = [NamedSharding(s.mesh, P()) for s in staging]  # a whole copy on every device
  output_bytes = lambda shardings: int(sh._staging_program(tuple(shardings)).lower(
      list(tree.values())).compile().memory_analysis().output_size_in_bytes)
  return {"exact": bool(exact), "layouts": layouts, "per_device": per_device,
          "staged_bytes": output_bytes(staging), "whole_bytes": output_bytes(whole)}


class TransferAcrossProcessesTest(absltest.TestCase):

  def test_trainer_shards_reach_the_sampler_of_each_process(self):
    from tests.training.multiprocess_test import free_port
    address = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               XLA_FLAGS=xla_flags.for_devices(4))
    procs = [subprocess.Popen([sys.executable, __file__, address, str(i)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(2)]
    outputs = [p.communicate(timeout=300)[0].decode(errors="replace") for p in procs]
    for p, out in zip(procs, outputs):
      self.assertEqual(p.returncode, 0, out[-4000:])
    results = [json.loads(out.strip().splitlines()[-1].split("RESULT ", 1)[1]) for out in outputs]
    for r in results:
      self.assertTrue(r["exact"], r)
      self.assertTrue(all(r["layouts"].values()), r)
      # Each process's 2 trainer devices hold half of every array that splits in two
      # (the largest dimension 2 divides), the odd one whole.
      self.assertEqual(r["per_device"], {"fsdp_rows": [4, 6], "odd_rows": [5, 3], "odd": [3],
                                         "bf16": [8, 4], "interleaved": [4, 2]})
      # What XLA allocates per trainer device for the staging (the output buffers, with their
      # tuple's table of 5 pointers): half of the bytes but the odd array's, where whole
      # copies would take them all.
      halves = (8 * 6 * 4 + 5 * 6 * 4 + 16 * 4 * 2 + 8 * 2 * 4) // 2 + 3 * 4
      self.assertEqual(r["staged_bytes"], halves + 5 * 8)
      self.assertEqual(r["whole_bytes"], 2 * halves - 3 * 4 + 5 * 8)


if __name__ == "__main__":
  if len(sys.argv) == 3 and not sys.argv[1].startswith("-"):
    print("RESULT " + json.dumps(worker(sys.argv[1], int(sys.argv[2]))), flush=True)
  else:
    absltest.main()
