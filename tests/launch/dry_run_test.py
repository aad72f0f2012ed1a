"""`jaxrl-llm-train --dry_run` of a TPU recipe on a host with one CPU device: the mesh is
checked against the slice the recipe names (config.mesh.topology), with no fake devices.

Two real `python -m launch.train --dry_run` processes (one CPU device, XLA_FLAGS unset) check
what only the command shows: its exit status, stdout or its one-line stderr, and that it
writes nothing. The other cases call the dry run itself (`cli._dry_run`, what the flag
runs) in this process, on the config the flags would give: every process start imports
jax, transformers and the library again (seconds), and these cases differ only in the
config.
"""
import contextlib
import io
import os
import subprocess
import sys

import jax
from absl.testing import absltest, parameterized

from jaxrl_llm import cli
from jaxrl_llm import config as config_lib
from jaxrl_llm.aot import chips
from tests.qwen3_gsm8k_config_test import tiny_qwen3, write_gsm8k_records

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dry_run(*flags):
  """`python -m launch.train --dry_run FLAGS` on one CPU device (XLA_FLAGS unset)."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  return subprocess.run([sys.executable, "-m", "launch.train", "--dry_run", *flags], cwd=REPO,
                        capture_output=True, text=True, timeout=300,
                        env=dict(env, JAX_PLATFORMS="cpu"))


def local_devices() -> str:
  """How the dry run names this process's devices (1 in `make test`'s session)."""
  n = jax.device_count()
  return f"the {n} {jax.devices()[0].platform} device{'s' * (n != 1)} here"


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
    """The real command, in its own process."""
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    run = dry_run(f"--config={config}", f"--workdir={workdir}",
                  f"--config.model.path={self.model}", f"--config.data.source={self.data}",
                  *flags)
    self.assertFalse(os.path.exists(workdir))  # nothing written
    return run

  def in_process(self, spec, **mesh):
    """`--dry_run --config=SPEC --config.mesh.KEY=VALUE...` in this process: (stdout,
    None), or (None, the one line the command prints for the config's error)."""
    config = config_lib.preset(spec)
    config.model.path, config.data.source = self.model, self.data
    config.mesh.update(mesh)
    out = io.StringIO()
    try:
      with contextlib.redirect_stdout(out):
        cli._dry_run(config)  # pylint: disable=protected-access
    except config_lib.ConfigError as e:  # the command: one line, exit status 2
      return None, "; ".join(str(e).splitlines())
    return out.getvalue(), None

  def test_the_command_checks_the_recipes_slice_and_writes_nothing(self):
    run = self.recipe("qwen3_8b_gsm8k")
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    self.assertIn("the mesh was checked against v5p:2x2x4's 16 chips (config.mesh.topology), "
                  "not the 1 cpu device here", run.stdout)
    self.assertIn("dry run: the config, the model directory and the data check out", run.stdout)

  @parameterized.parameters(
      ("qwen3_8b_gsm8k", "v5p:2x2x4's 16 chips"),
      ("qwen3_8b_gsm8k:tpu_v5p_32x2", "v5p:2x2x4 x 2 slices's 32 chips"),
      ("qwen3_8b_gsm8k:qlora_v5e_8", "v5e:2x4's 8 chips"),
  )
  def test_mesh_is_checked_against_the_recipes_slice(self, config, chips_named):
    out, error = self.in_process(config)
    self.assertIsNone(error)
    self.assertIn(f"the mesh was checked against {chips_named} (config.mesh.topology), not "
                  f"{local_devices()}", out)
    self.assertIn("dry run: the config, the model directory and the data check out", out)

  def test_a_mesh_that_does_not_fit_the_slice_is_refused(self):
    run = self.recipe("qwen3_8b_gsm8k", "--config.mesh.fsdp=5")
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stderr.strip(), "config.mesh (data=-1, fsdp=5, expert=1, context=1, "
                     "tensor=1): the other axes (5 devices) do not divide the 16 devices; "
                     "expected sizes whose product divides 16")

  def test_a_bad_topology_is_one_line(self):
    _, error = self.in_process("qwen3_8b_gsm8k", topology="v5p-32")
    self.assertEqual(error, "config.mesh.topology='v5p-32': expected "
                     "GENERATION:SHAPE with a generation of v4, v5e, v5p, v6e and a shape such "
                     "as 2x4 or 2x2x4 (e.g. v5e:2x4, v5p:2x2x4)")

  def test_without_a_topology_the_local_devices_are_checked(self):
    out, error = self.in_process("qwen3_8b_gsm8k", topology="", fsdp=1)
    self.assertIsNone(error)
    self.assertIn(f"the mesh was checked against {local_devices()}\n", out)
    _, error = self.in_process("qwen3_8b_gsm8k", topology="")  # fsdp=16 on this host
    self.assertIn(f"do not divide the {jax.device_count()} devices", error)


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
