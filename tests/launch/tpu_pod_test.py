"""`launch/tpu_pod.py --dry-run`: the gcloud command sequence for a v5e-16 and a v5p-32 slice.

Runs the script as a user does (`python launch/tpu_pod.py ...`, its own process) and reads
the printed commands back with shlex. Worker counts (Cloud TPU docs, see the module
docstring): v5litepod-16 = 16 v5e chips on 4 VMs of 4; v5p-32 = 32 TensorCores = 16 chips
on 4 VMs of 4.
"""
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest, parameterized

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "launch", "tpu_pod.py")
GCLOUD_TPU = ["gcloud", "compute", "tpus", "tpu-vm"]
SLICES = {  # accelerator -> (zone, runtime, chips, workers)
    "v5litepod-16": ("us-west4-a", "v2-alpha-tpuv5-lite", 16, 4),
    "v5p-32": ("us-east5-a", "v2-alpha-tpuv5", 16, 4),
}


def tpu_pod(*args, dry_run=True, env=None):
  return subprocess.run([sys.executable, SCRIPT, *(["--dry-run"] if dry_run else []), *args],
                        capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir(),
                        env=env)


def commands(run):
  """The printed commands, as argv lists; comment lines (#) dropped."""
  assert run.returncode == 0, run.stderr
  return [shlex.split(line) for line in run.stdout.splitlines() if not line.startswith("#")]


class TpuPodTest(parameterized.TestCase):

  @parameterized.parameters(*SLICES)
  def test_command_sequence(self, accelerator):
    zone, runtime, chips, workers = SLICES[accelerator]
    tpu = ["--name=rl-pod", f"--zone={zone}", f"--accelerator={accelerator}"]
    where = ["rl-pod", f"--zone={zone}"]

    create = tpu_pod("create", *tpu, "--capacity=spot")
    self.assertIn(f"# {accelerator}: {chips} chips on {workers} worker(s), runtime {runtime}",
                  create.stdout)
    self.assertEqual(commands(create), [
        GCLOUD_TPU + ["describe", *where, "--format=value(state,acceleratorType)"],
        GCLOUD_TPU + ["create", *where, f"--accelerator-type={accelerator}",
                      f"--version={runtime}", "--spot"],
    ])

    model = self.create_tempdir("Qwen3-0.6B").full_path
    install = commands(tpu_pod("install", *tpu, f"--upload={model}"))
    tar, copy, setup, upload = install
    self.assertEqual(tar[:3], ["tar", "-czf", copy[5]])
    self.assertEqual(tar[-3:], ["-C", REPO, "."])
    self.assertIn("--exclude=.git", tar)
    self.assertEqual(copy, GCLOUD_TPU + ["scp", copy[5], "rl-pod:jaxrl_llm_src.tar.gz",
                                         f"--zone={zone}", "--worker=all"])
    self.assertEqual(setup[:8], GCLOUD_TPU + ["ssh", *where, "--worker=all"])
    self.assertEqual(setup[8], "--command=mkdir -p jaxrl_llm && tar -xzf jaxrl_llm_src.tar.gz -C "
                     "jaxrl_llm && rm jaxrl_llm_src.tar.gz && cd jaxrl_llm && python3 -m pip "
                     "install -U pip && python3 -m pip install -e '.[gcs]' 'jax[tpu]'")
    self.assertEqual(upload, GCLOUD_TPU + ["scp", model, "rl-pod:jaxrl_llm/", f"--zone={zone}",
                                           "--worker=all", "--recurse"])

    config = f"configs/qwen3_gsm8k.py:tpu_{accelerator.replace('litepod', 'e')}"
    train = commands(tpu_pod("train", *tpu, f"--config={config}", "--workdir=gs://b/run 1",
                             "--", "--config.model.path=Qwen3-0.6B", "--config.train.steps=5"))
    self.assertLen(train, 2)
    start, follow = train
    self.assertEqual(start[:8], GCLOUD_TPU + ["ssh", *where, "--worker=all"])  # every worker
    remote = shlex.split(start[8].removeprefix("--command="))
    at = remote.index("nohup")
    self.assertEqual(remote[at + 1:at + 10], [
        "python3", "-m", "launch.train", "--multihost", f"--config={config}",
        "--workdir=gs://b/run 1", "--config.model.path=Qwen3-0.6B", "--config.train.steps=5",
        ">"])  # quoted for the remote shell: the space stays inside one argument
    self.assertIn("cd jaxrl_llm || exit 1;", start[8])
    self.assertTrue(start[8].endswith("< /dev/null & echo $! > train.pid"))
    self.assertEqual(follow, GCLOUD_TPU + ["ssh", *where, "--worker=0",
                                           "--command=tail -n 100 -F jaxrl_llm/train.log"])

    self.assertEqual(commands(tpu_pod("halt", *tpu)), [
        GCLOUD_TPU + ["ssh", *where, "--worker=all",
                      "--command=kill -TERM $(cat jaxrl_llm/train.pid)"]])
    self.assertEqual(commands(tpu_pod("delete", *tpu, "--project=my-proj")), [
        GCLOUD_TPU + ["delete", *where, "--project=my-proj", "--quiet"]])

  def test_remote_commands_in_a_shell(self):
    """The train and halt command lines, run by bash in a worker's home directory.

    A stand-in `launch.train` (it logs its arguments, and SIGTERM) takes the trainer's
    place, so what is checked is the shell: the pid file names the trainer itself (not a
    subshell), a second start refuses, and halt's SIGTERM reaches the trainer.
    """
    home = self.create_tempdir().full_path
    os.makedirs(os.path.join(home, "jaxrl_llm", "launch"))
    open(os.path.join(home, "jaxrl_llm", "launch", "__init__.py"), "w").close()
    with open(os.path.join(home, "jaxrl_llm", "launch", "train.py"), "w") as f:
      f.write("import signal, sys, time\n"
              "def stop(*_):\n  print('SIGTERM', flush=True)\n  sys.exit(75)\n"
              "signal.signal(signal.SIGTERM, stop)\n"
              "print(sys.argv[1:], flush=True)\ntime.sleep(60)\n")
    tpu = ["--name=n", "--zone=z", "--accelerator=v5p-32"]
    remote = lambda cmd: cmd[0][8].removeprefix("--command=")
    start = remote(commands(tpu_pod("train", *tpu, "--config=c.py", "--workdir=gs://b/r",
                                    "--nofollow", "--", "--config.seed=3")))
    halt = remote(commands(tpu_pod("halt", *tpu)))
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:/usr/bin:/bin")
    shell = lambda cmd: subprocess.run(["bash", "-c", cmd], cwd=home, env=env, text=True,
                                       capture_output=True, timeout=30)
    log = os.path.join(home, "jaxrl_llm", "train.log")
    read_log = lambda: open(log).read() if os.path.exists(log) else ""
    self.assertEqual(shell(start).returncode, 0)
    with open(os.path.join(home, "jaxrl_llm", "train.pid")) as f:
      pid = int(f.read())
    try:
      for _ in range(100):
        if read_log():
          break
        time.sleep(0.1)
      self.assertEqual(read_log(), "['--multihost', '--config=c.py', '--workdir=gs://b/r', "
                       "'--config.seed=3']\n")
      with open(f"/proc/{pid}/cmdline") as f:
        self.assertIn("launch.train", f.read())  # the pid is the trainer's own
      again = shell(start)
      self.assertEqual((again.returncode, again.stdout), (1, f"a run is going: pid {pid}\n"))
      self.assertEqual(shell(halt).returncode, 0)
      for _ in range(100):
        if "SIGTERM" in read_log():
          break
        time.sleep(0.1)
      self.assertIn("SIGTERM", read_log())
    finally:
      if "SIGTERM" not in read_log():  # the test failed before halt ended the stand-in
        os.kill(pid, signal.SIGKILL)

  @parameterized.parameters(("v4-8", 4, 1), ("v4-32", 16, 4), ("v5p-8", 4, 1), ("v5p-16", 8, 2),
                            ("v5p-64", 32, 8), ("v5litepod-8", 8, 1), ("v5litepod-32", 32, 8),
                            ("v6e-16", 16, 4))
  def test_workers(self, accelerator, chips, workers):
    run = tpu_pod("delete", "--name=n", "--zone=z", f"--accelerator={accelerator}")
    self.assertIn(f"# {accelerator}: {chips} chips on {workers} worker(s)", run.stdout)

  def test_single_host_slice(self):
    tpu = ["--name=one", "--zone=z", "--accelerator=v5litepod-8"]
    start = commands(tpu_pod("train", *tpu, "--config=c.py", "--workdir=/tmp/run", "--nofollow"))
    self.assertLen(start, 1)
    self.assertIn("nohup python3 -m launch.train --config=c.py --workdir=/tmp/run >", start[0][8])
    self.assertEqual(commands(tpu_pod("stop", *tpu)), [GCLOUD_TPU + ["stop", "one", "--zone=z"]])
    self.assertEqual(commands(tpu_pod("install", *tpu, "--pip_spec=jaxrl_llm[gcs]==0.1")), [
        GCLOUD_TPU + ["ssh", "one", "--zone=z", "--worker=all",
                      "--command=mkdir -p jaxrl_llm && python3 -m pip install -U pip && "
                      "python3 -m pip install 'jaxrl_llm[gcs]==0.1' 'jax[tpu]'"]])

  @parameterized.named_parameters(
      ("local_workdir_on_a_pod", ["train", "--accelerator=v5p-32", "--config=c.py",
                                  "--workdir=/tmp/run"],
       "tpu_pod: --workdir='/tmp/run' is a local path, but v5p-32 has 4 workers: each would "
       "write its own part of every checkpoint (orbax needs one directory all processes share): "
       "expected gs://BUCKET/PATH (or --shared_workdir for a shared mount)"),
      ("stop_a_pod", ["stop", "--accelerator=v5litepod-16"],
       "tpu_pod: v5litepod-16 has 4 workers; the TPU API stops single-host slices only: `halt` "
       "the run and `delete` the slice instead"),
      ("unknown_accelerator", ["create", "--accelerator=v5e-16"],
       "tpu_pod: --accelerator='v5e-16': expected one of v4-N, v5p-N, v5litepod-N, v6e-N, e.g. "
       "v5litepod-16 or v5p-32"),
      ("odd_core_count", ["create", "--accelerator=v5p-9"],
       "tpu_pod: --accelerator='v5p-9': the count is TensorCores, 2 per chip: expected a "
       "multiple of 2"),
      ("train_without_workdir", ["train", "--accelerator=v5p-32", "--config=c.py"],
       "tpu_pod: train needs --workdir"),
      ("no_command", [], "tpu_pod: expected a command, one of create, install, train, logs, "
                         "halt, stop, delete; got []"),
      ("arguments_to_another_command", ["delete", "--", "--x=1"],
       "tpu_pod: unexpected arguments ['--x=1']: only train passes arguments (after --)"),
  )
  def test_usage_errors(self, args, message):
    run = tpu_pod(*args[:1], "--name=n", "--zone=z", *args[1:])
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stderr.strip(), message)
    self.assertEqual(run.stdout, "")  # nothing printed as if it would run

  def test_no_gcloud(self):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable))
    run = tpu_pod("delete", "--name=n", "--zone=z", dry_run=False, env=env)
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertIn("gcloud is not on PATH: install the Google Cloud CLI", run.stderr)


if __name__ == "__main__":
  absltest.main()
