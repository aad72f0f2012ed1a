"""Every notebook in colabs/ runs top to bottom in its smoke mode, and is committed clean.

The notebooks run in a fresh Jupyter kernel of this interpreter (a kernelspec written to a
temporary Jupyter path), with `JAXRL_NOTEBOOK_SMOKE=1`; any cell that raises fails the test.
"""
import glob
import os
import sys
import time
from unittest import mock

from absl.testing import absltest, parameterized
from ipykernel import kernelspec
import nbclient
import nbformat
import pytest

from tests import xla_flags

pytestmark = pytest.mark.slow_file(
    "runs both notebooks top to bottom, each in a fresh Jupyter kernel that imports jax and "
    "transformers and trains (a GRPO run, a LoRA run, greedy samples before and after)")

COLABS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "colabs")
NOTEBOOKS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(COLABS, "*.ipynb")))
KERNEL = "jaxrl_llm_colabs_test"
# Devices each notebook runs on: one CPU device, like a Colab CPU runtime, and, for the
# notebook that sets an FSDP mesh, 2 fake CPU devices, so that the mesh shards (on 2 rather
# than 8, its programs compile and run faster).
DEVICES = {"grpo_quickstart.ipynb": 1, "bring_your_own.ipynb": 2}
CELL_TIMEOUT_S = 300
MAX_NOTEBOOK_BYTES = 40_000  # committed without outputs, a notebook is its text
WIDGET = "application/vnd.jupyter.widget-view+json"


def run_notebook(path: str, root: str, devices: int) -> nbformat.NotebookNode:
  """Executes the notebook at `path` in smoke mode, in a kernel started in `root`."""
  kernelspec.write_kernel_spec(os.path.join(root, "kernels", KERNEL))  # argv: sys.executable
  env = {"JAXRL_NOTEBOOK_SMOKE": "1", "XLA_FLAGS": xla_flags.for_devices(devices),
         "JUPYTER_PATH": root, "JUPYTER_RUNTIME_DIR": os.path.join(root, "runtime"),
         "IPYTHONDIR": os.path.join(root, "ipython")}
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S,
                                   resources={"metadata": {"path": root}})
  with mock.patch.dict(os.environ, env):  # the kernel inherits the environment at its start
    client.execute()
  return nb


def outputs(nb, cell_index: int) -> list:
  return nb.cells[cell_index].get("outputs", [])


def code_cells(nb):
  return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


class CommittedNotebooksTest(parameterized.TestCase):

  def test_the_required_notebooks_exist(self):
    self.assertContainsSubset({"grpo_quickstart.ipynb", "bring_your_own.ipynb"}, NOTEBOOKS)
    self.assertCountEqual(DEVICES, NOTEBOOKS)  # every notebook runs below

  @parameterized.parameters(*NOTEBOOKS)
  def test_committed_clean(self, name):
    path = os.path.join(COLABS, name)
    self.assertLess(os.path.getsize(path), MAX_NOTEBOOK_BYTES)
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    self.assertNotIn("widgets", nb.metadata)  # widget state is output too
    for i, cell in code_cells(nb):
      self.assertEqual(cell.outputs, [], f"{name}: code cell {i} has outputs")
      self.assertIsNone(cell.execution_count, f"{name}: code cell {i} has an execution count")
    source = "\n".join(c.source for c in nb.cells)
    self.assertIn("JAXRL_NOTEBOOK_SMOKE", source)
    self.assertIn('if importlib.util.find_spec("jaxrl_llm") is None:', source)  # skip the pip


class RunNotebooksTest(parameterized.TestCase):

  @parameterized.parameters(*NOTEBOOKS)
  @pytest.mark.slow("a notebook run top to bottom in a fresh Jupyter kernel: importing jax "
                    "and transformers, then its training cells compiled from scratch")
  def test_smoke_run(self, name):
    start = time.perf_counter()
    nb = run_notebook(os.path.join(COLABS, name), self.create_tempdir().full_path,
                      DEVICES[name])
    print(f"{name}: {time.perf_counter() - start:.1f} s in smoke mode on {DEVICES[name]} "
          f"device(s)", file=sys.stderr)
    cells = code_cells(nb)
    install, _ = cells[0]
    self.assertEqual(outputs(nb, install), [], "the install cell ran pip")
    every = [o for i, _ in cells for o in outputs(nb, i)]
    self.assertTrue(any(WIDGET in o.get("data", {}) for o in every),
                    "no progress-bar widget (tqdm.auto) in the training cell")
    text = "".join(o.get("text", "") for o in every)
    self.assertRegex(text, r"step +2 \| held-out \w+ [01]\.\d{3}")  # the evaluator's table rows
    if name == "grpo_quickstart.ipynb":
      self.assertTrue(any("image/png" in o.get("data", {}) for o in every), "no plot")
      self.assertRegex(text, r"held-out accuracy: [01]\.\d{3} at step 0 -> [01]\.\d{3} at step 2")
      self.assertEqual(text.count(" | before "), 12)


if __name__ == "__main__":
  absltest.main()
