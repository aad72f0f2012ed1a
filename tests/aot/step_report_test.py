"""aot.analysis.StepReport with a program XLA:TPU refused (out of HBM): the step has no
roofline and no MFU bound (not a sum that counts the refused program as 0 s), in the report,
its JSON line and bench/tpu_recipes.py's row. No compile: the reports are built by hand."""
import importlib.util
import math
import os

from absl.testing import absltest

from jaxrl_llm import config as config_lib
from jaxrl_llm.aot import analysis, chips, report

_spec = importlib.util.spec_from_file_location("tpu_recipes", os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "bench", "tpu_recipes.py"))
tpu_recipes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tpu_recipes)


def program(name: str, roofline_s: float, error: str | None = None) -> analysis.ProgramReport:
  return analysis.ProgramReport(
      name=name, placement="trainer", argument_bytes=2**30, output_bytes=0, alias_bytes=0,
      temp_bytes=2**30, resident={}, flops=1e12, bytes_accessed=1e9, collective_bytes=0.0,
      roofline_s=roofline_s, calls_per_step=1, model_flops=1e15, kernels=(), error=error)


def step(*programs) -> analysis.StepReport:
  return analysis.StepReport("v5p:2x2x1", chips.CHIPS["v5p"], {"trainer": 4}, list(programs),
                             overlapped=False, margin=0.1)


class StepReportTest(absltest.TestCase):

  def test_a_refused_program_leaves_the_step_without_a_roofline(self):
    result = step(program("sampler", 0.0, "RESOURCE_EXHAUSTED: out of memory"),
                  program("policy_update", 2.0))
    self.assertEqual(result.refused, ["sampler"])
    self.assertTrue(math.isnan(result.step_roofline_s))
    self.assertTrue(math.isnan(result.mfu_bound))
    line = result.to_json()
    self.assertIsNone(line["step_roofline_s"])
    self.assertIsNone(line["mfu_bound"])
    self.assertFalse(line["fits"])
    self.assertEqual(tpu_recipes._step(line), "- | -")  # pylint: disable=protected-access
    text = report.text(result, config_lib.preset("grpo"), "4 chips")
    self.assertIn("step: no roofline, XLA:TPU refused sampler", text)
    self.assertNotIn("MFU bound", text)

  def test_compiled_programs_add_up(self):
    result = step(program("sampler", 3.0), program("policy_update", 2.0))
    self.assertEqual(result.refused, [])
    self.assertEqual(result.step_roofline_s, 5.0)
    self.assertAlmostEqual(result.mfu_bound, 2e15 / (5.0 * chips.CHIPS["v5p"].peak_flops * 4))
    self.assertIn("= 5 s -> MFU bound", report.text(result, config_lib.preset("grpo"), "4 chips"))
    self.assertEqual(tpu_recipes._step(result.to_json()), f"5 | {100 * result.mfu_bound:.1f}%")


if __name__ == "__main__":
  absltest.main()
