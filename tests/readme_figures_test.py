"""bench/readme_figures.py: README's and the notebook's markers, and the figures written there.

The runs themselves take half an hour (`make figures`); here a run's metrics.jsonl is
written by hand and the marked text is rewritten in copies of README.md and the notebook.
"""
import importlib.util
import json
import os
import re
import shutil

from absl.testing import absltest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "readme_figures", os.path.join(REPO, "bench", "readme_figures.py"))
readme_figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_figures)


def fake_run(workdir: str, accuracy: dict, wall: float) -> dict:
  """A finished run's files (held-out accuracy at `accuracy`'s steps, three training steps
  between evaluations) and their figures."""
  os.makedirs(workdir, exist_ok=True)
  rows = []
  for step, value in accuracy.items():
    if step:
      rows += [{"step": s, "step_time_s": 2.0 + s % 3, "sample_time_s": 1.0,
                "update_time_s": 0.5} for s in range(step - 2, step + 1)]
    rows.append({"step": step, "eval/reward/calculator_exact": value,
                 "eval/reward/calculator_valid_call": 1.0, "eval/reward_mean": value})
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(workdir, "wall_s"), "w") as f:
    f.write(f"{wall}\n")
  with open(os.path.join(workdir, "load"), "w") as f:
    f.write("1.5\n")
  return readme_figures.figures(workdir)


class ReadmeFiguresTest(absltest.TestCase):

  def test_every_figure_is_marked_once_where_it_is_written(self):
    for name, paths in readme_figures.MARKED.items():
      for path in paths:
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
          text = f.read()
        opened, closed = f"<!-- figures:{name} -->", f"<!-- /figures:{name} -->"
        self.assertEqual((text.count(opened), text.count(closed)), (1, 1), (name, path))
        self.assertLess(text.index(opened), text.index(closed))
        # Inside a line: a line that starts with `<!--` is an HTML block, its text unrendered.
        self.assertNotRegex(text, rf'(^|\n)[ "]*<!-- /?figures:{name} ')

  def test_figures_of_a_run(self):
    fig = fake_run(self.create_tempdir().full_path, {0: 0.0, 3: 0.5, 6: 0.75}, 125.4)
    self.assertEqual(fig["accuracy"], {0: 0.0, 3: 0.5, 6: 0.75})
    self.assertEqual(fig["valid_call"], {0: 1.0, 3: 1.0, 6: 1.0})
    self.assertEqual((fig["step_s"], fig["sample_s"], fig["wall"], fig["load"]),
                     (3.0, 1.0, 125.4, 1.5))

  def test_rewritten_figures_replace_only_the_marked_text(self):
    root = self.create_tempdir().full_path
    os.makedirs(os.path.join(root, "colabs"))
    for path in ("README.md", readme_figures.NOTEBOOK):
      shutil.copy(os.path.join(REPO, path), os.path.join(root, path))
    tmp = self.create_tempdir().full_path
    results = {n: fake_run(os.path.join(tmp, n), {0: 0.25, 20: 0.5, 60: 0.875, 80: 0.9375}, 95)
               for n in ("demo", "notebook", "calculator", "calculator_agent", "moe")}
    for name, paths in readme_figures.MARKED.items():
      for path in paths:
        readme_figures.rewrite(path, name, readme_figures.render(name, results, "2031-01-02"),
                               root=root)
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
      readme = f.read()
    self.assertIn("from 0.25 to 0.50 in 20 steps and 0.88-0.94 from step 60 to 80, in 1:35 on "
                  "2 CPU cores (load average 1.5), 2031-01-02<!-- /figures:demo -->", readme)
    self.assertIn("| held-out accuracy | 0.250 | 0.500 | 0.875 | 0.938 |\n", readme)
    self.assertIn("| agent program, held-out accuracy | 0.250 | 0.500 | 0.875 | 0.938 |\n"
                  "| agent program, valid-call rate | 1.000 | 1.000 | 1.000 | 1.000 |\n"
                  "| environment, held-out accuracy | 0.250 | 0.500 | 0.875 | 0.938 |\n", readme)
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
      unmarked = lambda text: re.sub(r"<!-- figures:(\w+) -->.*?<!-- /figures:\1 -->", "",
                                     text, flags=re.S)
      self.assertEqual(unmarked(readme), unmarked(f.read()))
    with open(os.path.join(root, readme_figures.NOTEBOOK), encoding="utf-8") as f:
      cells = json.load(f)["cells"]
    self.assertIn("The whole notebook took <!-- figures:notebook -->1.6 minutes on 2 CPU cores "
                  "(load average 1.5), 2031-01-02 (held-out accuracy 0.250 at step 0, 0.938 at "
                  "step 80)<!-- /figures:notebook -->.\n", cells[0]["source"])

  def test_a_missing_marker_is_one_line(self):
    root = self.create_tempdir().full_path
    with open(os.path.join(root, "README.md"), "w") as f:
      f.write("no markers\n")
    with self.assertRaisesRegex(ValueError, r"^--write: no <!-- figures:demo --> markers in "
                                            r"README.md$"):
      readme_figures.rewrite("README.md", "demo", "x", root=root)


if __name__ == "__main__":
  absltest.main()
