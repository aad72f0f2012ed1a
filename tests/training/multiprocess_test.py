"""Two processes x 4 CPU devices, joined by `jax.distributed`, train like 1 process x 8.

The two-process run is the real command line (`jaxrl_llm.cli`, the program of
`python -m launch.train`), which trains the smoke config and then, in the same two processes
(tests/training/multiprocess_runs.py), the others; the one-process run, the reference, trains
in the test's own process (8 devices: every test here is marked `mesh`) on the same config
(tests/training/multiprocess_configs.py). In the two-process run each process loads its
own half of the prompts, samples and scores them (or plays their episodes with its own
environments), and the update steps run on global arrays over one 2 x 2 x 2 mesh spanning
both processes; process 0 alone writes the logs.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from absl.testing import absltest

from jaxrl_llm import training
from tests import xla_flags
from tests.training import multiprocess_configs
from tests.training.run_logs import comparable

pytestmark = pytest.mark.slow_file(
    "four runs over two processes joined by jax.distributed (one start of the pair: each "
    "process imports jax and transformers once and compiles every run's programs over a mesh "
    "spanning both), each beside its one-process reference on 8 devices")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "tests", "training", "multiprocess_configs.py")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# The runs of the two processes, in the order they train: the first is the command line's
# (`jaxrl_llm.cli`: --config, --workdir, the process flags), the others follow it in the same
# two processes (tests/training/multiprocess_runs.py), each in a workdir of its own.
RUNS = ("smoke", "shared", "split", "calculator")
_PAIR = {}  # tmp, workdirs: {name: workdir}, procs: the two processes, outputs: once ended


def start_two_processes() -> None:
  """Starts the two processes (2 x 4 CPU devices) that train every config of `RUNS`, once
  per module: this process trains the one-process references meanwhile."""
  if _PAIR:
    return
  tmp = tempfile.mkdtemp(prefix="multiprocess_test_")
  workdirs = {name: os.path.join(tmp, name) for name in RUNS}
  address = f"127.0.0.1:{free_port()}"
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=xla_flags.for_devices(4))
  flags = [f"--config={CONFIGS}:{RUNS[0]}", f"--workdir={workdirs[RUNS[0]]}",
           *(f"--then={name}:{workdirs[name]}" for name in RUNS[1:]),
           f"--coordinator_address={address}", "--num_processes=2"]
  _PAIR.update(tmp=tmp, workdirs=workdirs, procs=[])
  for i in range(2):  # their output to files: a pipe, unread while the tests train, could fill
    with open(os.path.join(tmp, f"output.{i}"), "wb") as out:
      _PAIR["procs"].append(subprocess.Popen(
          [sys.executable, "-m", "tests.training.multiprocess_runs", *flags,
           f"--process_id={i}"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))


def train_on_one_process(name) -> str:
  """The workdir where this process (8 devices) trained `name`, the reference, once."""
  start_two_processes()
  workdir = os.path.join(_PAIR["tmp"], f"one_{name}")
  if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    training.train(multiprocess_configs.get_config(name), workdir)
  return workdir


def train_on_two_processes(test, name) -> tuple[str, list[str]]:
  """The workdir where the two processes trained `name`, and both processes' outputs. The
  first call trains every reference of `RUNS` while the two processes run."""
  start_two_processes()
  if "outputs" not in _PAIR:
    for other in RUNS:
      train_on_one_process(other)
    for p in _PAIR["procs"]:
      p.wait(timeout=1800)
    _PAIR["outputs"] = []
    for i in range(2):
      with open(os.path.join(_PAIR["tmp"], f"output.{i}"), errors="replace") as f:
        _PAIR["outputs"].append(f.read())
  procs, outputs = _PAIR["procs"], _PAIR["outputs"]
  if any(p.returncode for p in procs):  # both tails: the first to fail may be either
    test.fail(f"{RUNS}: exit codes {[p.returncode for p in procs]}\n" + "\n".join(
        f"--- process {i}: the errors, then the end:\n{_errors(out)}\n...\n{out[-2500:]}"
        for i, out in enumerate(outputs)))
  return _PAIR["workdirs"][name], outputs


def read_rows(workdir, name="metrics.jsonl"):
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(line) for line in f]


def tearDownModule():
  for p in _PAIR.get("procs", ()):
    if p.poll() is None:  # a test stopped before waiting for them
      p.kill()
      p.wait()
  if _PAIR:
    shutil.rmtree(_PAIR["tmp"], ignore_errors=True)


def _errors(output: str) -> str:
  """The lines of a process's output that say why it stopped (Python's and XLA's errors)."""
  lines = [l for l in output.splitlines()
           if re.search(r"Error|error:|Check failed|^F\d{4}|Fatal|Terminating", l)]
  return "\n".join(lines[:20])


def assert_same_metrics(test, want: list[dict], got: list[dict], what: str = "") -> None:
  """Every logged row's comparable metrics equal, at the multi-process tolerance."""
  for a, b in zip(want, got):
    a, b = comparable(a), comparable(b)
    test.assertEqual(a.keys(), b.keys())
    for k in a:
      np.testing.assert_allclose(b[k], a[k], rtol=2e-4, atol=2e-5,
                                 err_msg=f"{what}step {a['step']} {k}")


def assert_same_rollouts(test, one: str, two: str, rows: int) -> None:
  """rollouts.jsonl holds both processes' rows, in the order one process logs them."""
  want, got = (read_rows(d, "rollouts.jsonl") for d in (one, two))
  test.assertLen(got, rows)
  for a, b in zip(want, got):
    np.testing.assert_allclose(b.pop("behaviour_logprobs"), a.pop("behaviour_logprobs"),
                               atol=2e-5)
    test.assertEqual(a, b)


@pytest.mark.mesh
@pytest.mark.slow("the first test of the file waits for the two processes joined by "
                  "jax.distributed (one start: every run of RUNS, each compiling its programs "
                  "over a mesh spanning both) and meanwhile trains every run's reference on 8 "
                  "devices in this process; the other tests read what they wrote")
class MultiProcessTest(absltest.TestCase):

  def test_two_processes_of_four_devices_match_one_of_eight(self):
    one = train_on_one_process("smoke")  # this process: 8 devices
    two, outputs = train_on_two_processes(self, "smoke")

    # Process 0 alone printed the config and wrote the logs.
    self.assertIn("num_samples", outputs[0])
    self.assertNotIn("num_samples", outputs[1])
    want, got = read_rows(one), read_rows(two)
    self.assertEqual([r["step"] for r in got], [0, 1, 2])  # 0: the eval at the start
    self.assertIn("eval/reward_mean", got[-1])
    assert_same_metrics(self, want, got)
    self.assertTrue(os.path.isdir(os.path.join(two, "checkpoints", "2")))
    self.assertTrue(os.path.exists(os.path.join(two, "export", "model.safetensors")))
    assert_same_rollouts(self, one, two, 8)  # step 2: 2 prompts x 4 samples


@pytest.mark.mesh
@pytest.mark.slow("multi-turn episodes (a sampler program per turn, greedy ones for the "
                  "evaluation) compiled in two processes joined by jax.distributed, then "
                  "for the reference on 8 devices in this process")
class MultiTurnMultiProcessTest(absltest.TestCase):

  def test_episodes_on_two_processes_match_one(self):
    """Multi-turn episodes with asynchronous rollouts: each process plays its own records'
    episodes; metrics, held-out accuracy and the episodes logged equal one process's."""
    one = train_on_one_process("calculator")  # this process: 8 devices
    two, _ = train_on_two_processes(self, "calculator")

    want, got = read_rows(one), read_rows(two)
    self.assertEqual([r["step"] for r in got], [0, 1, 2])
    self.assertIn("env/tool_calls", got[1])
    self.assertIn("eval/env/tool_ok_frac", got[-1])
    self.assertTrue(all(r["async/staleness_max"] <= 1 for r in got[1:]), got)
    assert_same_metrics(self, want, got)
    self.assertTrue(os.path.isdir(os.path.join(two, "checkpoints", "2")))
    assert_same_rollouts(self, one, two, 16)  # step 2: 4 records x 4 episodes


@pytest.mark.mesh
@pytest.mark.slow("two processes joined by jax.distributed, each importing jax and "
                  "transformers and compiling the asynchronous trainer's and sampler's "
                  "programs, then the reference on 8 devices in this process")
class AsyncMultiProcessTest(absltest.TestCase):
  """max_async_level=1 over 2 processes x 4 devices: the same run as 1 process x 8."""

  def _compare(self, placement):
    one = train_on_one_process(placement)  # this process: 8 devices
    two, _ = train_on_two_processes(self, placement)

    want, got = read_rows(one), read_rows(two)
    self.assertEqual([r["step"] for r in got], [1, 2, 3, 4])  # each step logged once
    self.assertEqual([r["async/policy_version"] for r in got], [0, 0, 1, 2])
    self.assertTrue(all(r["async/staleness_max"] <= 1 for r in got), got)
    assert_same_metrics(self, want, got, f"{placement}: ")
    self.assertTrue(os.path.isdir(os.path.join(two, "checkpoints", "4")))

  def test_shared_placement(self):
    self._compare("shared")

  def test_split_placement(self):
    self._compare("split")


if __name__ == "__main__":
  absltest.main()
