"""`jaxrl-llm-train --dry_run` of a TPU recipe on a host with one CPU device: the mesh is
checked against the slice the recipe names (config.mesh.topology), with no fake devices."""
import os
import subprocess
import sys

from absl.testing import absltest, parameterized

from jaxrl_llm.aot import chips
from tests.qwen3_gsm8k_config_test import tiny_qwen3, write_gsm8k_records

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dry_run(*flags):
  """`python -m launch.train --dry_run FLAGS` on one CPU device (XLA_FLAGS unset)."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  return subprocess.run([sys.executable, "-m", "launch.train", "--dry_run", *flags], cwd=REPO,
                        capture_output=True, text=True, timeout=300,
                        env=dict(env, JAX_PLATFORMS="cpu"))


class DryRunTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    root = absltest.get_default_test_tmpdir()
    cls.model = tiny_qwen3(os.path.join(root, "dry_run_qwen3"))
    data = os.path.join(root, "dry_run_gsm8k")
    os.makedirs(data, exist_ok=True)
    cls.data = f"jsonl:{write_gsm8k_records(data)}/{{split}}.jsonl"

  def recipe(self, config, *flags):
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    run = dry_run(f"--config={config}", f"--workdir={workdir}",
                  f"--config.model.path={self.model}", f"--config.data.source={self.data}",
                  *flags)
    self.assertFalse(os.path.exists(workdir))  # nothing written
    return run

  @parameterized.parameters(
      ("qwen3_8b_gsm8k", "v5p:2x2x4's 16 chips"),
      ("qwen3_8b_gsm8k:tpu_v5p_32x2", "v5p:2x2x4 x 2 slices's 32 chips"),
      ("qwen3_8b_gsm8k:qlora_v5e_8", "v5e:2x4's 8 chips"),
  )
  def test_mesh_is_checked_against_the_recipes_slice(self, config, chips_named):
    run = self.recipe(config)
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    self.assertIn(f"the mesh was checked against {chips_named} (config.mesh.topology), not the "
                  "1 cpu device here", run.stdout)
    self.assertIn("dry run: the config, the model directory and the data check out", run.stdout)

  def test_a_mesh_that_does_not_fit_the_slice_is_refused(self):
    run = self.recipe("qwen3_8b_gsm8k", "--config.mesh.fsdp=5")
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stderr.strip(), "config.mesh (data=-1, fsdp=5, expert=1, context=1, "
                     "tensor=1): the other axes (5 devices) do not divide the 16 devices; "
                     "expected sizes whose product divides 16")

  def test_a_bad_topology_is_one_line(self):
    run = self.recipe("qwen3_8b_gsm8k", "--config.mesh.topology=v5p-32")
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stderr.strip(), "config.mesh.topology='v5p-32': expected "
                     "GENERATION:SHAPE with a generation of v4, v5e, v5p, v6e and a shape such "
                     "as 2x4 or 2x2x4 (e.g. v5e:2x4, v5p:2x2x4)")

  def test_without_a_topology_the_local_devices_are_checked(self):
    run = self.recipe("qwen3_8b_gsm8k", "--config.mesh.topology=", "--config.mesh.fsdp=1")
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    self.assertIn("the mesh was checked against the 1 cpu device here\n", run.stdout)
    run = self.recipe("qwen3_8b_gsm8k", "--config.mesh.topology=")  # fsdp=16 on one device
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertIn("do not divide the 1 devices", run.stderr)


class SliceChipsTest(parameterized.TestCase):

  @parameterized.parameters(("v5e:2x4", 1, 8), ("v5p:2x2x4", 1, 16), ("v5p:2x2x4", 2, 32),
                            ("v6e:4x4", 1, 16), ("v4:2x2x2", 1, 8))
  def test_one_per_chip(self, name, slices, count):
    devices = chips.slice_chips(name, slices)
    self.assertLen(devices, count)
    self.assertLen({d.id for d in devices}, count)
    self.assertLen({d.coords + (d.slice_index,) for d in devices}, count)
    self.assertEqual({d.slice_index for d in devices}, set(range(slices)))

  @parameterized.parameters(("v5e:2x4", 1), ("v5p:2x2x4", 2), ("v6e:4x4", 1))
  def test_as_many_as_the_compilers_devices(self, name, slices):
    """libtpu's description of the slice (no TPU needed) has the same chips: kind,
    coordinates and slices (v4, whose compiler counts TensorCores, is left out)."""
    real = chips.topology_devices(name, slices)
    planned = chips.slice_chips(name, slices)
    self.assertLen(planned, len(real))
    self.assertEqual({d.device_kind for d in planned}, {d.device_kind for d in real})
    self.assertEqual({(d.coords, d.slice_index) for d in planned},
                     {(tuple(d.coords), getattr(d, "slice_index", 0)) for d in real})

  def test_bad_slice_count_names_the_field(self):
    with self.assertRaisesRegex(chips.TopologyError, r"^config.mesh.num_slices=0: expected 1 "
                                "or more$"):
      chips.slice_chips("v5e:2x4", 0, ("config.mesh.topology", "config.mesh.num_slices"))


if __name__ == "__main__":
  absltest.main()
