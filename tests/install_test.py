"""Installing the package outside the repository, and what its requirements alone run.

A plain (non-editable) install of the wheel, built once, used from outside the
repository, as a notebook or a pod installs it: only `jaxrl_llm` lands in site-packages
(its presets inside it), its console scripts are installed, `jaxrl-llm-train` trains a
preset by name, and the agent demo plays (`jaxrl-llm-demo`). Its one fresh virtual
environment is `make demo`'s: the wheel's own requirements (install_requires and the demo
extra), resolved through the test environment's installed distributions, are linked into a
folder of their own, and only that folder is on the fresh environment's path (through a
path file, which runs none of the test environment's own path files, so the repository's
editable install stays out), so a requirement missing from setup.py (one the test extras
bring, as torch brings jinja2) is missing there too. The tests need no network, except the
dry run of `make demo`'s install.
"""
import collections
import email
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest
from absl.testing import absltest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow_file(
    "builds the wheel and a fresh virtual environment, then runs the console script and "
    "the calculator demo in it, each a new process importing jax and transformers")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("setup.py", "README.md", "jaxrl_llm", "configs")  # what setup.py packages
UV = os.path.join(os.path.dirname(sys.executable), "uv")  # make's installer (Makefile)


def run(cmd, **kwargs):
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
  assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
  return result


def build_wheel(tmp: str) -> str:
  """The wheel of a copy of the checkout (the build leaves the checkout clean)."""
  source = os.path.join(tmp, "source")
  os.makedirs(source)
  for name in SOURCES:
    if os.path.isdir(os.path.join(REPO, name)):
      shutil.copytree(os.path.join(REPO, name), os.path.join(source, name),
                      ignore=shutil.ignore_patterns("__pycache__"))
    else:
      shutil.copy(os.path.join(REPO, name), os.path.join(source, name))
  run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
       "-w", os.path.join(tmp, "wheels"), source])
  return os.path.join(tmp, "wheels", os.listdir(os.path.join(tmp, "wheels"))[0])


def install_in_fresh_venv(tmp: str, wheel: str, dependencies: str) -> tuple[str, str]:
  """A new virtual environment holding `wheel`, with the `dependencies` folder on its path
  (through a path file); returns its bin folder and its site-packages."""
  venv = os.path.join(tmp, "venv")
  run([sys.executable, "-m", "venv", "--without-pip", venv])
  python = os.path.join(venv, "bin", "python")
  site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
             ).stdout.strip()
  with open(os.path.join(site, "test_dependencies.pth"), "w") as f:
    f.write(dependencies + "\n")
  run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel])
  return os.path.join(venv, "bin"), site


def wheel_requirements(wheel: str, extras: tuple[str, ...]) -> list[Requirement]:
  """The wheel's Requires-Dist entries that apply with `extras`."""
  with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = email.message_from_bytes(z.read(name))
  return [r for r in map(Requirement, metadata.get_all("Requires-Dist"))
          if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("",) + extras)]


def installed_closure(requirements: list[Requirement]) -> set[str]:
  """The installed distributions that `requirements` need, followed through their own
  requirements (with the extras asked of them), as pip would resolve them here."""
  names, seen, todo = set(), set(), list(requirements)
  while todo:
    req = todo.pop()
    key = (canonicalize_name(req.name), frozenset(req.extras))
    if key in seen:
      continue
    seen.add(key)
    names.add(key[0])
    for r in map(Requirement, importlib.metadata.distribution(req.name).requires or ()):
      if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in {""} | req.extras):
        todo.append(r)
  return names


def link_distributions(names: set[str], target: str):
  """Links the files of the installed distributions `names` into `target`: a folder whole
  where only they own files under it, else folder by folder (namespace packages such as
  `google/`, which other distributions share)."""
  owners = collections.defaultdict(set)  # a path in site-packages, or a folder above one
  entries = collections.defaultdict(set)  # folder ('' at the top) -> names in it to link
  location = {}
  for dist in importlib.metadata.distributions():
    name = canonicalize_name(dist.metadata["Name"])
    for parts in (f.parts for f in dist.files or () if f.parts[0] != ".."):
      for i in range(1, len(parts) + 1):
        owners["/".join(parts[:i])].add(name)
        if name in names:
          entries["/".join(parts[:i - 1])].add(parts[i - 1])
          location["/".join(parts[:i])] = str(dist.locate_file(""))

  def link(folder):
    for entry in entries[folder]:
      path = f"{folder}/{entry}" if folder else entry
      if owners[path] <= names:
        os.symlink(os.path.join(location[path], path), os.path.join(target, path))
      else:
        os.makedirs(os.path.join(target, path))
        link(path)

  os.makedirs(target)
  link("")


class InstalledWheelTest(absltest.TestCase):
  """The wheel, built once, installed once in a fresh virtual environment whose path holds
  only the wheel's own requirements with its demo extra (`make demo`'s environment)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix="install_test_")
    cls.wheel = build_wheel(cls.tmp)
    cls.names = installed_closure(wheel_requirements(cls.wheel, ("demo",)))
    dependencies = os.path.join(cls.tmp, "dependencies")
    link_distributions(cls.names, dependencies)
    cls.bin_dir, cls.site = install_in_fresh_venv(cls.tmp, cls.wheel, dependencies)
    cls.python = os.path.join(cls.bin_dir, "python")
    cls.outside = os.path.join(cls.tmp, "elsewhere")  # no checkout on the path
    os.makedirs(cls.outside)
    cls.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cls.env["JAX_PLATFORMS"] = "cpu"

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  @pytest.mark.slow("the class's set-up (building the wheel, a fresh virtual environment, "
                    "installing into it) falls to this test, then the console script trains "
                    "a step in a new process importing jax and transformers")
  def test_installs_jaxrl_llm_only_and_trains_a_preset_by_name(self):
    """A plain (non-editable) install: only `jaxrl_llm` lands in site-packages (its presets
    inside it), and the console script trains a preset by name from outside the checkout."""
    installed = sorted(os.listdir(self.site))
    self.assertIn("jaxrl_llm", installed)
    self.assertNotIn("configs", installed)
    self.assertNotIn("launch", installed)
    self.assertTrue(os.path.isfile(os.path.join(self.site, "jaxrl_llm", "presets", "grpo.py")))
    for command in ("train", "evaluate", "compile", "serve", "demo"):  # setup.py's console scripts
      self.assertTrue(os.path.isfile(os.path.join(self.bin_dir, f"jaxrl-llm-{command}")), command)

    where = run([self.python, "-c",
                 "from jaxrl_llm.config import presets; print(presets.directory())"],
                cwd=self.outside, env=self.env).stdout.strip()
    self.assertEqual(where, os.path.join(self.site, "jaxrl_llm", "presets"))
    workdir = os.path.join(self.tmp, "run")
    run([os.path.join(self.bin_dir, "jaxrl-llm-train"), "--config=smoke", f"--workdir={workdir}",
         "--config.train.steps=1", "--config.logging.trackers=jsonl"],
        cwd=self.outside, env=self.env)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    self.assertEqual([r["step"] for r in rows], [1])
    self.assertTrue(os.path.isfile(os.path.join(workdir, "export", "config.json")))

  @pytest.mark.slow("the calculator demo's console script in a fresh environment: a new "
                    "process importing jax and transformers, then one step of multi-turn "
                    "episodes and a held-out evaluation, compiled from scratch")
  def test_the_demo_requirements_alone_play_the_agent_demo(self):
    """The calculator demo, one step, where only the wheel's requirements with its demo
    extra are installed (no PyTorch, nothing the test extras bring), and no command prints
    transformers' advice that PyTorch is absent."""
    self.assertNotIn("torch", self.names)
    python, outside, env = self.python, self.outside, self.env
    bare = subprocess.run([python, "-c", "import torch"], cwd=outside, env=env,
                          capture_output=True, text=True)
    self.assertIn("No module named 'torch'", bare.stderr)
    # transformers gives the advice here unless jaxrl_llm is imported first.
    advice = run([python, "-c", "import transformers"], cwd=outside, env=env).stderr
    self.assertIn("PyTorch was not found", advice)

    workdir = os.path.join(self.tmp, "calculator")
    demo = run([os.path.join(self.bin_dir, "jaxrl-llm-demo"), "--task=calculator",
                f"--workdir={workdir}", "--config.train.steps=1",
                "--config.train.prompts_per_step=2", "--config.data.task_options.num_eval=4",
                "--config.logging.rollouts_every=1"], cwd=outside, env=env)
    self.assertIn("held-out accuracy (eval/reward/calculator_exact)", demo.stdout)
    self.assertNotIn("PyTorch was not found", demo.stderr)
    with open(os.path.join(workdir, "rollouts.jsonl")) as f:
      episodes = [json.loads(line) for line in f]
    self.assertLen(episodes, 2 * 4)  # two problems, four episodes each
    self.assertEqual(episodes[0]["messages"][0]["role"], "user")  # the opening, and its tools
    self.assertEqual([t["function"]["name"] for t in episodes[0]["tools"]], ["calc"])
    self.assertTrue(os.path.isfile(os.path.join(workdir, "curves.png")))


class DemoEnvironmentTest(absltest.TestCase):

  def test_make_demo_installs_the_demo_extras_only(self):
    """`make demo` from a clean clone: the package with its demo extras, which pip resolves
    without PyTorch (the test extras bring it, for the parity tests)."""
    plan = run(["make", "-n", "-B", "demo"], cwd=REPO).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line and " -e " in line]
    self.assertEqual(len(installs), 1, plan)  # uv's, or pip's where uv fails: both the demo's
    self.assertEqual(installs[0].count('-e ".[demo]"'), 2, installs[0])
    tmp = self.create_tempdir().full_path
    venv = os.path.join(tmp, "venv")
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    self.assertTrue(os.path.exists(UV), "make installs uv into the test environment")
    # What uv would install into a fresh environment, as `make demo` runs it (resolved from
    # the registry; nothing installed): the demo's dependencies.
    flags = run([sys.executable, os.path.join(REPO, ".ci", "uv_flags.py")]).stdout.split()
    plan = run([UV, "pip", "install", "--dry-run", "--python", os.path.join(venv, "bin", "python"),
                *flags, REPO + "[demo]"]).stderr
    names = {line.split()[1].split("==")[0] for line in plan.splitlines()
             if line.startswith(" + ")}
    self.assertIn("jaxrl-llm", names)
    self.assertIn("tensorboard", names)
    self.assertIn("matplotlib", names)
    self.assertNotIn("torch", names)


if __name__ == "__main__":
  absltest.main()
