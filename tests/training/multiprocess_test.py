"""Two processes x 4 CPU devices, joined by `jax.distributed`, train like 1 process x 8.

Both runs are the real command line. In the two-process run each process loads its own
half of the prompts, samples and scores them (or plays their episodes with its own
environments), and the update steps run on global arrays over one 2 x 2 x 2 mesh spanning
both processes; process 0 alone writes the logs.
"""
import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from absl.testing import absltest

from jaxrl_llm import training
from tests.training import async_configs
from tests.training.run_logs import comparable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = textwrap.dedent("""
    from configs import smoke

    def get_config():
      config = smoke.get_config()
      config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
      config.train.steps = 3
      config.train.eval_every = 3
      config.data.task_options = dict(num_eval=6)
      config.optimizer.lr = 1e-3
      config.checkpoint.every = 2
      config.logging.rollouts_every = 2
      config.rewards.functions = ("tests.training.test_rewards:count_a",)
      config.rewards.weights = (1.0,)
      return config
""")

# The calculator agent (its shipped warm start, its tool environment) with asynchronous
# rollouts: each process plays its own records' episodes on its first device.
MULTI_TURN_CONFIG = textwrap.dedent("""
    from configs import grpo_calculator

    def get_config():
      config = grpo_calculator.get_config("steps=2")
      config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
      config.algo.max_async_level = 1
      config.train.prompts_per_step = 4
      config.train.micro_batch_size = 16
      config.train.eval_every = 2
      config.data.task_options = dict(config.data.task_options, num_eval=4)
      config.checkpoint.every = 2
      config.logging.rollouts_every = 2
      return config
""")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(config_path, workdir, devices, *extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return subprocess.Popen(
      [sys.executable, "-m", "launch.train", f"--config={config_path}", f"--workdir={workdir}",
       *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def read_rows(workdir, name="metrics.jsonl"):
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(line) for line in f]


def train_on_two_processes(test, config_spec, workdir) -> list[str]:
  """Trains `config_spec` on 2 processes x 4 CPU devices in `workdir`; their outputs."""
  address = f"127.0.0.1:{free_port()}"
  procs = [launch(config_spec, workdir, 4, f"--coordinator_address={address}",
                  "--num_processes=2", f"--process_id={i}") for i in range(2)]
  outputs = [p.communicate(timeout=900)[0].decode(errors="replace") for p in procs]
  if any(p.returncode for p in procs):  # both tails: the first to fail may be either
    test.fail(f"{config_spec}: exit codes {[p.returncode for p in procs]}\n" + "\n".join(
        f"--- process {i}: the errors, then the end:\n{_errors(out)}\n...\n{out[-2500:]}"
        for i, out in enumerate(outputs)))
  return outputs


def _errors(output: str) -> str:
  """The lines of a process's output that say why it stopped (Python's and XLA's errors)."""
  lines = [l for l in output.splitlines()
           if re.search(r"Error|error:|Check failed|^F\d{4}|Fatal|Terminating", l)]
  return "\n".join(lines[:20])


def train_on_one_process(test, config_spec, workdir) -> None:
  """Trains `config_spec` on 1 process x 8 CPU devices in `workdir`, from the command line."""
  single = launch(config_spec, workdir, 8)
  out = single.communicate(timeout=900)[0].decode(errors="replace")
  test.assertEqual(single.returncode, 0, out[-4000:])


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


def write_config(tmp: str, name: str, text: str) -> str:
  path = os.path.join(tmp, name)
  with open(path, "w") as f:
    f.write(text)
  return path


class MultiProcessTest(absltest.TestCase):

  def test_two_processes_of_four_devices_match_one_of_eight(self):
    tmp = self.create_tempdir().full_path
    config_path = write_config(tmp, "two_by_four.py", CONFIG)
    one, two = os.path.join(tmp, "one"), os.path.join(tmp, "two")
    outputs = train_on_two_processes(self, config_path, two)
    train_on_one_process(self, config_path, one)

    # Process 0 alone printed the config and wrote the logs.
    self.assertIn("num_samples", outputs[0])
    self.assertNotIn("num_samples", outputs[1])
    want, got = read_rows(one), read_rows(two)
    self.assertEqual([r["step"] for r in got], [0, 1, 2, 3])  # 0: the eval at the start
    self.assertIn("eval/reward_mean", got[-1])
    assert_same_metrics(self, want, got)
    self.assertTrue(os.path.isdir(os.path.join(two, "checkpoints", "2")))
    self.assertTrue(os.path.exists(os.path.join(two, "export", "model.safetensors")))
    assert_same_rollouts(self, one, two, 8)  # step 2: 2 prompts x 4 samples


class MultiTurnMultiProcessTest(absltest.TestCase):

  def test_episodes_on_two_processes_match_one(self):
    """Multi-turn episodes with asynchronous rollouts: each process plays its own records'
    episodes; metrics, held-out accuracy and the episodes logged equal one process's."""
    tmp = self.create_tempdir().full_path
    config_path = write_config(tmp, "calculator_two_by_four.py", MULTI_TURN_CONFIG)
    one, two = os.path.join(tmp, "one"), os.path.join(tmp, "two")
    train_on_two_processes(self, config_path, two)
    train_on_one_process(self, config_path, one)

    want, got = read_rows(one), read_rows(two)
    self.assertEqual([r["step"] for r in got], [0, 1, 2])
    self.assertIn("env/tool_calls", got[1])
    self.assertIn("eval/env/tool_ok_frac", got[-1])
    self.assertTrue(all(r["async/staleness_max"] <= 1 for r in got[1:]), got)
    assert_same_metrics(self, want, got)
    self.assertTrue(os.path.isdir(os.path.join(two, "checkpoints", "2")))
    assert_same_rollouts(self, one, two, 16)  # step 2: 4 records x 4 episodes


@pytest.mark.mesh
class AsyncMultiProcessTest(absltest.TestCase):
  """max_async_level=1 over 2 processes x 4 devices: the same run as 1 process x 8."""

  def _compare(self, placement):
    tmp = self.create_tempdir().full_path
    one, two = os.path.join(tmp, "one"), os.path.join(tmp, "two")
    config_path = os.path.join(ROOT, "tests", "training", "async_configs.py")
    train_on_two_processes(self, f"{config_path}:{placement}", two)
    training.train(async_configs.get_config(placement), one)  # this process: 8 devices

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
