"""A plain (non-editable) install, used from outside the repository, as a notebook or a
pod installs it: only `jaxrl_llm` lands in site-packages (its presets inside it), and the
console script trains a preset by name.

The fresh virtual environment takes its dependencies from the test environment's
site-packages through a path file (which runs none of that directory's own path files, so
the repository's editable install stays out): the test needs no network.
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
from absl.testing import absltest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("setup.py", "README.md", "jaxrl_llm", "configs")  # what setup.py packages


def run(cmd, **kwargs):
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
  assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
  return result


@pytest.mark.slow
class NonEditableInstallTest(absltest.TestCase):

  def test_installs_jaxrl_llm_only_and_trains_a_preset_by_name(self):
    tmp = self.create_tempdir().full_path
    source = os.path.join(tmp, "source")  # a copy, so the build leaves the checkout clean
    os.makedirs(source)
    for name in SOURCES:
      if os.path.isdir(os.path.join(REPO, name)):
        shutil.copytree(os.path.join(REPO, name), os.path.join(source, name),
                        ignore=shutil.ignore_patterns("__pycache__"))
      else:
        shutil.copy(os.path.join(REPO, name), os.path.join(source, name))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", os.path.join(tmp, "wheels"), source])
    venv = os.path.join(tmp, "venv")
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = os.path.join(venv, "bin", "python")
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
               ).stdout.strip()
    with open(os.path.join(site, "test_dependencies.pth"), "w") as f:
      f.write(sysconfig.get_paths()["purelib"] + "\n")
    wheel = os.path.join(tmp, "wheels", os.listdir(os.path.join(tmp, "wheels"))[0])
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel])

    installed = sorted(os.listdir(site))
    self.assertIn("jaxrl_llm", installed)
    self.assertNotIn("configs", installed)
    self.assertNotIn("launch", installed)
    self.assertTrue(os.path.isfile(os.path.join(site, "jaxrl_llm", "presets", "grpo.py")))

    outside = os.path.join(tmp, "elsewhere")  # no checkout on the path
    os.makedirs(outside)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = run([python, "-c", "from jaxrl_llm.config import presets; print(presets.directory())"],
                cwd=outside, env=env).stdout.strip()
    self.assertEqual(where, os.path.join(site, "jaxrl_llm", "presets"))
    workdir = os.path.join(tmp, "run")
    run([os.path.join(venv, "bin", "jaxrl-llm-train"), "--config=smoke", f"--workdir={workdir}",
         "--config.train.steps=1", "--config.logging.tensorboard=false"], cwd=outside, env=env)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    self.assertEqual([r["step"] for r in rows], [1])
    self.assertTrue(os.path.isfile(os.path.join(workdir, "export", "config.json")))


@pytest.mark.slow
class DemoEnvironmentTest(absltest.TestCase):

  def test_make_demo_installs_the_demo_extras_only(self):
    """`make demo` from a clean clone: the package with its demo extras, which pip resolves
    without PyTorch (the test extras bring it, for the parity tests)."""
    plan = run(["make", "-n", "-B", "demo"], cwd=REPO).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line and " -e " in line]
    self.assertEqual(len(installs), 1, plan)
    self.assertIn('-e ".[demo]"', installs[0])
    tmp = self.create_tempdir().full_path
    venv = os.path.join(tmp, "venv")
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    report = os.path.join(tmp, "report.json")
    # What pip would install into a fresh environment (resolved from the registry; nothing
    # installed): the demo's dependencies.
    run([sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"), "install",
         "-q", "--dry-run", "--ignore-installed", "--report", report, REPO + "[demo]"])
    with open(report) as f:
      names = {item["metadata"]["name"].lower() for item in json.load(f)["install"]}
    self.assertIn("tensorboard", names)
    self.assertIn("matplotlib", names)
    self.assertNotIn("torch", names)


if __name__ == "__main__":
  absltest.main()
