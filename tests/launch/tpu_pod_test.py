"""`launch/tpu_pod.py`: its gcloud commands for a v5e-16 and a v5p-32 slice, and their shell.

Runs the script as a user does (`python launch/tpu_pod.py ...`, its own process) and reads
the printed commands back with shlex (`--dry-run`). What depends on a slice's state
(`create`) runs for real against a stand-in `gcloud` on PATH that prints a given state for
`describe` and records every call. The remote shell commands (the venv set-up of
`install`, `train`, `halt`) run in /bin/sh with stand-ins for the interpreters, uv and the
trainer. Worker counts (Cloud TPU docs, see the module docstring): v5litepod-16 = 16 v5e
chips on 4 VMs of 4; v5p-32 = 32 TensorCores = 16 chips on 4 VMs of 4.
"""
import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest, parameterized

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "launch", "tpu_pod.py")
GCLOUD_TPU = ["gcloud", "compute", "tpus", "tpu-vm"]
GCLOUD_QUEUED = ["gcloud", "compute", "tpus", "queued-resources"]
SLICES = {  # accelerator -> (zone, runtime, chips, workers)
    "v5litepod-16": ("us-west4-a", "v2-alpha-tpuv5-lite", 16, 4),
    "v5p-32": ("us-east5-a", "v2-alpha-tpuv5", 16, 4),
}
# The venv set-up of `install` (launch/tpu_pod.py:venv_command), piece by piece.
FIND_PYTHON = "py=$(command -v python3.13 || command -v python3.12 || command -v python3.11)"
UV_FALLBACK = ('{ command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh; } '
               '&& uv venv --seed --python "${py:-3.12}" .venv')
PIP = ".venv/bin/python -m pip install"
PIP_TAIL = f"&& {PIP} -U pip && {PIP} "

# Stand-in gcloud: records its arguments (one JSON list a line); `describe` prints
# $FAKE_TPU_STATE or $FAKE_QUEUED_STATE, or fails with NOT_FOUND as gcloud does when unset.
FAKE_GCLOUD = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
  f.write(json.dumps(sys.argv[1:]) + "\\n")
if "describe" in sys.argv:
  state = os.environ.get("FAKE_QUEUED_STATE" if "queued-resources" in sys.argv else
                         "FAKE_TPU_STATE")
  if state is None:
    sys.exit("ERROR: (gcloud.compute.tpus.describe) NOT_FOUND: Resource was not found")
  print(state)
"""


def tpu_pod(*args, dry_run=True, env=None):
  return subprocess.run([sys.executable, SCRIPT, *(["--dry-run"] if dry_run else []), *args],
                        capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir(),
                        env=env)


@functools.cache
def printed(*args):
  """`tpu_pod(*args)` with --dry-run (it prints, runs nothing), once for the tests that read
  the same command: a `train` imports the library to check its --config (seconds)."""
  return tpu_pod(*args)


# The `train` commands that several tests read: a multi-host slice's, a single host's.
POD_TRAIN = ("train", "--name=rl-pod", "--zone=us-east5-a", "--accelerator=v5p-32",
             "--config=configs/qwen3_gsm8k.py:tpu_v5p_32", "--workdir=gs://b/run 1", "--",
             "--config.model.path=Qwen3-0.6B", "--config.train.steps=5")
HOST_TRAIN = ("train", "--name=one", "--zone=us-west4-a", "--accelerator=v5litepod-8",
              "--config=smoke", "--workdir=/tmp/run", "--nofollow")


def commands(run):
  """The printed commands, as argv lists; comment lines (#) dropped."""
  assert run.returncode == 0, run.stderr
  return [shlex.split(line) for line in run.stdout.splitlines() if not line.startswith("#")]


def write_script(path, text):
  with open(path, "w") as f:
    f.write(text)
  os.chmod(path, 0o755)


class TpuPodTest(parameterized.TestCase):

  def fake_gcloud(self, *args, tpu_state=None, queued_state=None):
    """Runs tpu_pod for real with the stand-in gcloud; returns the run and gcloud's calls."""
    bin_dir = self.create_tempdir().full_path
    write_script(os.path.join(bin_dir, "gcloud"), FAKE_GCLOUD)
    log = os.path.join(bin_dir, "calls.jsonl")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin",
               FAKE_GCLOUD_LOG=log)
    for key, value in (("FAKE_TPU_STATE", tpu_state), ("FAKE_QUEUED_STATE", queued_state)):
      env.pop(key, None)
      if value is not None:
        env[key] = value
    run = tpu_pod(*args, dry_run=False, env=env)
    calls = [["gcloud", *json.loads(line)] for line in open(log)] if os.path.exists(log) else []
    return run, calls

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
    self.assertIn("--exclude=.venv", tar)  # the workers' venv survives a second install
    self.assertEqual(copy, GCLOUD_TPU + ["scp", copy[5], "rl-pod:jaxrl_llm_src.tar.gz",
                                         f"--zone={zone}", "--worker=all"])
    self.assertEqual(setup[:8], GCLOUD_TPU + ["ssh", *where, "--worker=all"])
    self.assertLen(setup, 9)
    remote = setup[8].removeprefix("--command=")
    self.assertTrue(remote.startswith(
        "mkdir -p jaxrl_llm && tar -xzf jaxrl_llm_src.tar.gz -C jaxrl_llm && rm "
        "jaxrl_llm_src.tar.gz && cd jaxrl_llm && if ! .venv/bin/python -c "), remote)
    self.assertIn(FIND_PYTHON, remote)  # the interpreter search, newest first
    self.assertIn(UV_FALLBACK, remote)  # none there (or no venv module): uv makes the venv
    self.assertTrue(remote.endswith(f"{PIP_TAIL}-e '.[gcs]' 'jax[tpu]>=0.10'"), remote)
    self.assertNotIn("python3 -m pip", remote)  # never the image's Python 3.10
    self.assertEqual(upload, GCLOUD_TPU + ["scp", model, "rl-pod:jaxrl_llm/", f"--zone={zone}",
                                           "--worker=all", "--recurse"])

    variant = {"v5litepod-16": "tpu_v5e_8", "v5p-32": "tpu_v5p_32"}[accelerator]  # the recipe's
    config = f"configs/qwen3_gsm8k.py:{variant}"
    train = commands(printed("train", *tpu, f"--config={config}", "--workdir=gs://b/run 1",
                             "--", "--config.model.path=Qwen3-0.6B", "--config.train.steps=5"))
    self.assertLen(train, 2)
    start, follow = train
    self.assertEqual(start[:8], GCLOUD_TPU + ["ssh", *where, "--worker=all"])  # every worker
    remote = shlex.split(start[8].removeprefix("--command="))
    at = remote.index("nohup")
    self.assertEqual(remote[at + 1:at + 8], [
        ".venv/bin/jaxrl-llm-train", "--multihost", f"--config={config}",
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

  def test_queued_create_and_delete(self):
    tpu = ["--name=rl-pod", "--zone=us-east5-a", "--accelerator=v5p-32", "--queued"]
    where = ["rl-pod", "--zone=us-east5-a"]
    create = tpu_pod("create", *tpu, "--capacity=spot", "--project=p")
    self.assertEqual(commands(create), [
        GCLOUD_QUEUED + ["describe", *where, "--project=p", "--format=value(state.state)"],
        GCLOUD_QUEUED + ["create", *where, "--project=p", "--node-id=rl-pod",
                         "--accelerator-type=v5p-32", "--runtime-version=v2-alpha-tpuv5",
                         "--spot"],
    ])
    on_demand = commands(tpu_pod("create", *tpu))[-1]
    self.assertEqual(on_demand[-1], "--runtime-version=v2-alpha-tpuv5")  # no --spot
    self.assertEqual(commands(tpu_pod("delete", *tpu)), [
        GCLOUD_QUEUED + ["delete", *where, "--force", "--quiet"]])  # --force: its node too

  @parameterized.named_parameters(
      ("absent", None, ["describe", "create"], "", 0),
      ("ready", "READY", ["describe"], "Reusing TPU 'rl-pod' (v5p-32, READY).", 0),
      ("creating", "CREATING", ["describe"], "(v5p-32, CREATING): not ready yet", 0),
      ("repairing", "REPAIRING", ["describe"], "(v5p-32, REPAIRING): not ready yet", 0),
      ("stopped", "STOPPED", ["describe", "start"], "STOPPED): starting it.", 0),
      ("preempted", "PREEMPTED", ["describe", "delete", "create"],
       "TPU 'rl-pod' is PREEMPTED: it cannot be restarted (a preempted Spot TPU must be "
       "recreated). Deleting it, then creating it anew.", 0),
      ("terminated", "TERMINATED", ["describe", "delete", "create"], "is TERMINATED", 0),
      ("deleting", "DELETING", ["describe"],
       "tpu_pod: TPU 'rl-pod' is DELETING: it can be neither used nor replaced while it is; "
       "try create again when it is over", 2),
  )
  def test_create_by_node_state(self, state, verbs, message, returncode):
    """`create` against a stand-in gcloud whose describe prints STATE<tab>v5p-32."""
    run, calls = self.fake_gcloud(
        "create", "--name=rl-pod", "--zone=us-east5-a", "--accelerator=v5p-32",
        "--capacity=spot", tpu_state=None if state is None else f"{state}\tv5p-32")
    self.assertEqual(run.returncode, returncode, run.stderr)
    self.assertIn(message, run.stdout if returncode == 0 else run.stderr)
    self.assertEqual([call[4] for call in calls], verbs)
    where = ["rl-pod", "--zone=us-east5-a"]
    if "delete" in verbs:  # a preempted Spot slice: deleted, then created anew
      self.assertEqual(calls[1:], [
          GCLOUD_TPU + ["delete", *where, "--quiet"],
          GCLOUD_TPU + ["create", *where, "--accelerator-type=v5p-32",
                        "--version=v2-alpha-tpuv5", "--spot"]])

  def test_create_refuses_another_accelerator(self):
    run, calls = self.fake_gcloud("create", "--name=rl-pod", "--zone=us-east5-a",
                                  "--accelerator=v5p-32", tpu_state="PREEMPTED\tv5p-64")
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stderr.strip(), "tpu_pod: a TPU named 'rl-pod' already exists with "
                     "accelerator type 'v5p-64', not 'v5p-32': delete it or choose another --name")
    self.assertLen(calls, 1)  # nothing deleted

  @parameterized.named_parameters(
      ("absent", None, ["describe", "create"], "Queued. The slice is there when"),
      ("waiting", "WAITING_FOR_RESOURCES", ["describe"],
       "Queued resource 'rl-pod' is WAITING_FOR_RESOURCES: the TPU is not there yet. Run create "
       "again later, or watch for state ACTIVE: gcloud compute tpus queued-resources describe "
       "rl-pod --zone=us-east5-a"),
      ("provisioning", "PROVISIONING", ["describe"], "is PROVISIONING"),
      ("suspended", "SUSPENDED", ["describe", "delete", "create"],
       "Queued resource 'rl-pod' is SUSPENDED (a preempted Spot slice's request is SUSPENDED)"),
      ("failed", "FAILED", ["describe", "delete", "create"], "is FAILED"),
  )
  def test_queued_create_by_state(self, state, verbs, message):
    run, calls = self.fake_gcloud(
        "create", "--name=rl-pod", "--zone=us-east5-a", "--accelerator=v5p-32", "--queued",
        "--capacity=spot", queued_state=state)
    self.assertEqual(run.returncode, 0, run.stderr)
    self.assertIn(message, run.stdout)
    self.assertEqual([call[:5] for call in calls], [GCLOUD_QUEUED + [v] for v in verbs])
    where = ["rl-pod", "--zone=us-east5-a"]
    self.assertEqual(calls[0], GCLOUD_QUEUED + ["describe", *where, "--format=value(state.state)"])
    if "delete" in verbs:  # the suspended request and its node go, a new request is queued
      self.assertEqual(calls[1:], [
          GCLOUD_QUEUED + ["delete", *where, "--force", "--quiet"],
          GCLOUD_QUEUED + ["create", *where, "--node-id=rl-pod", "--accelerator-type=v5p-32",
                           "--runtime-version=v2-alpha-tpuv5", "--spot"]])

  def test_queued_active_reuses_its_node(self):
    run, calls = self.fake_gcloud(
        "create", "--name=rl-pod", "--zone=us-east5-a", "--accelerator=v5p-32", "--queued",
        queued_state="ACTIVE", tpu_state="READY\tv5p-32")
    self.assertEqual(run.returncode, 0, run.stderr)
    self.assertIn("Reusing TPU 'rl-pod' (v5p-32, READY), the node of queued resource 'rl-pod' "
                  "(ACTIVE).", run.stdout)
    self.assertEqual([call[3:5] for call in calls], [["queued-resources", "describe"],
                                                     ["tpu-vm", "describe"]])

  def test_queued_deleting_refused(self):
    run, calls = self.fake_gcloud("create", "--name=rl-pod", "--zone=us-east5-a",
                                  "--accelerator=v5p-32", "--queued", queued_state="DELETING")
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stderr.strip(), "tpu_pod: queued resource 'rl-pod' is DELETING: it can "
                     "be neither used nor replaced while it is; try create again when it is over")
    self.assertLen(calls, 1)

  @parameterized.named_parameters(
      ("internal_ip", "--internal_ip", [], "--internal-ip"),
      ("iap", "--tunnel_through_iap", ["alpha"], "--tunnel-through-iap"),  # alpha-only in gcloud
  )
  def test_workers_without_external_ips(self, flag, track, gcloud_flag):
    tpu = ["--name=n", "--zone=us-west4-a", "--accelerator=v5litepod-16", flag]
    model = self.create_tempdir().full_path
    runs = [commands(tpu_pod("install", *tpu, f"--upload={model}")),
            commands(tpu_pod("train", *tpu, "--config=smoke", "--workdir=gs://b/r")),
            commands(tpu_pod("logs", *tpu)), commands(tpu_pod("halt", *tpu))]
    remote = [cmd for run in runs for cmd in run if cmd[0] == "gcloud"]
    self.assertEqual(sorted({cmd[len(track) + 4] for cmd in remote}), ["scp", "ssh"])
    for cmd in remote:
      self.assertEqual(cmd[:len(track) + 4], ["gcloud", *track, "compute", "tpus", "tpu-vm"])
      self.assertEqual(cmd[-1], gcloud_flag, cmd)
    create = commands(tpu_pod("create", *tpu))
    self.assertNotIn(gcloud_flag, [arg for cmd in create for arg in cmd])  # ssh and scp only

  def test_remote_commands_in_a_shell(self):
    """The train and halt command lines, run by /bin/sh in a worker's home directory (the
    v5p-32 `train` of test_command_sequence: a workdir with a space, arguments after --).

    A stand-in trainer at jaxrl_llm/.venv/bin/jaxrl-llm-train (it logs its arguments, and
    SIGTERM) takes the trainer's place, so what is checked is the shell: the pid file names
    the trainer itself (not a subshell), a second start refuses, and halt's SIGTERM reaches
    the trainer.
    """
    home = self.create_tempdir().full_path
    os.makedirs(os.path.join(home, "jaxrl_llm", ".venv", "bin"))
    write_script(os.path.join(home, "jaxrl_llm", ".venv", "bin", "jaxrl-llm-train"),
                 f"#!{sys.executable}\n"
                 "import signal, sys, time\n"
                 "def stop(*_):\n  print('SIGTERM', flush=True)\n  sys.exit(75)\n"
                 "signal.signal(signal.SIGTERM, stop)\n"
                 "print(sys.argv[1:], flush=True)\ntime.sleep(60)\n")
    remote = lambda cmd: cmd[0][8].removeprefix("--command=")
    start = remote(commands(printed(*POD_TRAIN)))
    halt = remote(commands(tpu_pod("halt", *POD_TRAIN[1:4])))
    env = dict(os.environ, PATH="/usr/bin:/bin", HOME=home)
    shell = lambda cmd: subprocess.run(["/bin/sh", "-c", cmd], cwd=home, env=env, text=True,
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
      self.assertEqual(read_log(), "['--multihost', '--config=configs/qwen3_gsm8k.py:tpu_v5p_32', "
                       "'--workdir=gs://b/run 1', '--config.model.path=Qwen3-0.6B', "
                       "'--config.train.steps=5']\n")
      with open(f"/proc/{pid}/cmdline") as f:
        self.assertIn(".venv/bin/jaxrl-llm-train", f.read())  # the pid is the trainer's own
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

  def test_train_before_install(self):
    home = self.create_tempdir().full_path
    os.makedirs(os.path.join(home, "jaxrl_llm"))
    start = commands(printed(*HOST_TRAIN))[0][8].removeprefix("--command=")
    run = subprocess.run(["/bin/sh", "-c", start], cwd=home, text=True, capture_output=True,
                         timeout=30, env=dict(os.environ, PATH="/usr/bin:/bin"))
    self.assertEqual((run.returncode, run.stderr),
                     (1, "no ~/jaxrl_llm/.venv/bin/jaxrl-llm-train: run install first\n"))
    self.assertFalse(os.path.exists(os.path.join(home, "jaxrl_llm", "train.pid")))

  @parameterized.named_parameters(
      # (interpreters on the worker's PATH, extra flags, the calls the set-up makes)
      ("python3_12", ["python3.12"], [], ["python3.12 -m venv .venv"]),
      ("newest_first", ["python3.11", "python3.13"], [], ["python3.13 -m venv .venv"]),
      ("flag", ["python3.11", "python3.13"], ["--python=python3.11"],
       ["python3.11 -m venv .venv"]),
      ("none_uv_installed", [], [], ["curl -LsSf https://astral.sh/uv/install.sh",
                                     "uv venv --seed --python 3.12 .venv"]),
      ("no_venv_module", ["python3.12:broken"], [],
       ["python3.12 -m venv .venv", "curl -LsSf https://astral.sh/uv/install.sh",
        "uv venv --seed --python {bin}/python3.12 .venv"]),
  )
  def test_install_venv_in_a_shell(self, pythons, flags, expected):
    """The --pip_spec install command in /bin/sh, with stand-ins for what it calls.

    The stand-in interpreters and uv log their arguments and make .venv/bin/python, itself
    a stand-in that logs its arguments (pip's); curl prints a script that installs the
    stand-in uv into ~/.local/bin, as uv's installer does. PATH holds the stand-ins and
    the few tools the command uses, no real Python, so the search sees only the
    stand-ins. A second install keeps the venv.
    """
    home, bin_dir, tools = (self.create_tempdir().full_path for _ in range(3))
    log = os.path.join(home, "calls.log")
    for tool in ("sh", "rm", "mkdir", "cp", "chmod"):
      os.symlink(shutil.which(tool), os.path.join(tools, tool))
    make_venv = ('dir=; for a in "$@"; do dir=$a; done\n'  # the last argument
                 'mkdir -p "$dir/bin"\n'
                 'printf \'#!/bin/sh\\necho "venv-python $*" >> "$LOG"\\n\' > "$dir/bin/python"\n'
                 'chmod +x "$dir/bin/python"\n')
    for python in pythons:
      name, _, broken = python.partition(":")
      write_script(os.path.join(bin_dir, name), f'#!/bin/sh\necho "{name} $*" >> "$LOG"\n' +
                   ("exit 1\n" if broken else make_venv))
    uv = os.path.join(bin_dir, "uv-standin")
    write_script(uv, '#!/bin/sh\necho "uv $*" >> "$LOG"\n' + make_venv)
    write_script(os.path.join(bin_dir, "curl"),
                 '#!/bin/sh\necho "curl $*" >> "$LOG"\n'
                 f'echo \'mkdir -p "$HOME/.local/bin" && cp {uv} "$HOME/.local/bin/uv"\'\n')
    run = commands(tpu_pod("install", "--name=n", "--zone=us-west4-a",
                           "--accelerator=v5litepod-8", "--pip_spec=jaxrl_llm[gcs]==0.1",
                           *flags))
    self.assertLen(run, 1)
    remote = run[0][8].removeprefix("--command=")
    env = {"PATH": f"{bin_dir}:{tools}", "HOME": home, "LOG": log}
    for _ in range(2):
      done = subprocess.run(["/bin/sh", "-c", remote], cwd=home, env=env, text=True,
                            capture_output=True, timeout=30)
      self.assertEqual(done.returncode, 0, done.stderr)
    with open(log) as f:
      calls = [line.rstrip("\n") for line in f]
    version_check = 'venv-python -c import sys; sys.exit(sys.version_info < (3, 11))'
    pip = ["venv-python -m pip install -U pip",
           "venv-python -m pip install jaxrl_llm[gcs]==0.1 jax[tpu]>=0.10"]
    expected = [line.format(bin=bin_dir) for line in expected]
    self.assertEqual(calls, [*expected, *pip, version_check, *pip])  # 2nd: the venv is kept
    self.assertTrue(os.path.isdir(os.path.join(home, "jaxrl_llm", ".venv")))

  @parameterized.parameters(("v4-8", 4, 1), ("v4-32", 16, 4), ("v5p-8", 4, 1), ("v5p-16", 8, 2),
                            ("v5p-64", 32, 8), ("v5litepod-8", 8, 1), ("v5litepod-32", 32, 8),
                            ("v6e-16", 16, 4))
  def test_workers(self, accelerator, chips, workers):
    run = tpu_pod("delete", "--name=n", "--zone=z", f"--accelerator={accelerator}")
    self.assertIn(f"# {accelerator}: {chips} chips on {workers} worker(s)", run.stdout)

  def test_single_host_slice(self):
    tpu = ["--name=one", "--zone=us-west4-a", "--accelerator=v5litepod-8"]
    where = ["one", "--zone=us-west4-a"]
    start = commands(printed(*HOST_TRAIN))
    self.assertLen(start, 1)
    self.assertIn("nohup .venv/bin/jaxrl-llm-train --config=smoke --workdir=/tmp/run >",
                  start[0][8])
    self.assertEqual(commands(tpu_pod("stop", *tpu)), [GCLOUD_TPU + ["stop", *where]])
    install = commands(tpu_pod("install", *tpu, "--pip_spec=jaxrl_llm[gcs]==0.1"))
    self.assertLen(install, 1)
    self.assertEqual(install[0][:8], GCLOUD_TPU + ["ssh", *where, "--worker=all"])
    remote = install[0][8].removeprefix("--command=")
    self.assertTrue(remote.startswith("mkdir -p jaxrl_llm && cd jaxrl_llm && if ! "), remote)
    self.assertIn(FIND_PYTHON, remote)
    self.assertTrue(remote.endswith(f"{PIP_TAIL}'jaxrl_llm[gcs]==0.1' 'jax[tpu]>=0.10'"), remote)
    chosen = commands(tpu_pod("install", *tpu, "--pip_spec=x", "--python=/opt/py 3/python"))
    self.assertIn("py='/opt/py 3/python';", chosen[0][8])  # instead of the search
    self.assertNotIn("command -v python3", chosen[0][8])

  def test_any_zone(self):
    tpu = ["--name=n", "--zone=us-east5-a", "--accelerator=v5litepod-16", "--any_zone"]
    self.assertEqual(commands(tpu_pod("create", *tpu))[-1][4], "create")

  @parameterized.named_parameters(
      ("local_workdir_on_a_pod", ["train", "--accelerator=v5p-32", "--config=smoke",
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
      ("misspelt_config_variant", ["train", "--accelerator=v5litepod-8", "--zone=us-west4-a",
                                   "--config=configs/qwen3_gsm8k.py:tpu_v5e_9",
                                   "--workdir=gs://b/r"],
       "tpu_pod: --config='configs/qwen3_gsm8k.py:tpu_v5e_9': ValueError: Unknown config "
       "argument 'tpu_v5e_9'; valid: ['gpu_1', 'runlocal', 'size', 'tpu_v5e_8', 'tpu_v5p_32']."),
      ("missing_config_file", ["train", "--accelerator=v5litepod-8", "--zone=us-west4-a",
                               "--config=configs/nope.py", "--workdir=gs://b/r"],
       "tpu_pod: --config='configs/nope.py': no file 'configs/nope.py' in this repository "
       "(expected a preset name or a config file relative to its root)"),
      ("train_without_workdir", ["train", "--accelerator=v5p-32", "--config=smoke"],
       "tpu_pod: train needs --workdir"),
      ("no_command", [], "tpu_pod: expected a command, one of create, install, train, logs, "
                         "halt, stop, delete; got []"),
      ("arguments_to_another_command", ["delete", "--", "--x=1"],
       "tpu_pod: unexpected arguments ['--x=1']: only train passes arguments (after --)"),
      ("preemptible", ["create", "--accelerator=v5p-8", "--capacity=preemptible"],
       "tpu_pod: --capacity=preemptible: preemptible TPUs are the legacy model that Spot VMs "
       "succeed: use --capacity=spot (or on_demand)"),
      ("unknown_capacity", ["create", "--accelerator=v5p-8", "--capacity=reserved"],
       "tpu_pod: --capacity='reserved': expected one of on_demand, spot"),
      ("internal_ip_and_iap", ["halt", "--internal_ip", "--tunnel_through_iap"],
       "tpu_pod: --internal_ip and --tunnel_through_iap exclude each other (gcloud takes one): "
       "--internal_ip from inside the slice's network, --tunnel_through_iap from outside it"),
  )
  def test_usage_errors(self, args, message):
    run = tpu_pod(*args[:1], "--name=n", "--zone=us-east5-a", *args[1:])
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stderr.strip(), message)
    self.assertEqual(run.stdout, "")  # nothing printed as if it would run

  @parameterized.named_parameters(
      ("create_v5e", "create", "us-east5-a", "v5litepod-16", []),
      ("train_v6e", "train", "us-central2-b", "v6e-8",
       ["--config=smoke", "--workdir=gs://b/r"]),
      ("install_v5p", "install", "us-west4-a", "v5p-8", []),
  )
  def test_zone_without_the_accelerator(self, command, zone, accelerator, args):
    run = tpu_pod(command, "--name=n", f"--zone={zone}", f"--accelerator={accelerator}", *args)
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stdout, "")
    self.assertLen(run.stderr.splitlines(), 1)
    self.assertRegex(run.stderr, rf"^tpu_pod: --zone={zone} does not offer {accelerator}\b.*: "
                     r"Google lists it in [a-z0-9-]+(, [a-z0-9-]+)* "
                     r"\(https://cloud.google.com/tpu/docs/regions-zones\); pass --any_zone if "
                     rf"{zone} offers it now\n$")
    if accelerator == "v5litepod-16":
      self.assertEqual(run.stderr, "tpu_pod: --zone=us-east5-a does not offer v5litepod-16 "
                       "(v5e): Google lists it in us-central1-a, us-south1-a, us-west1-c, "
                       "us-west4-a (https://cloud.google.com/tpu/docs/regions-zones); pass "
                       "--any_zone if us-east5-a offers it now\n")

  def test_no_gcloud(self):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable))
    run = tpu_pod("delete", "--name=n", "--zone=z", dry_run=False, env=env)
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertIn("gcloud is not on PATH: install the Google Cloud CLI", run.stderr)


if __name__ == "__main__":
  absltest.main()
