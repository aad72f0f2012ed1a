r"""Runs a config on a Cloud TPU VM slice with `gcloud`: create, install, train, logs, delete.

From a clone of this repository, on a machine with the Google Cloud CLI (`gcloud auth
login` done; the project from --project or gcloud's default):

  TPU="--name=qwen3-grpo --zone=us-east5-a --accelerator=v5p-32"
  python launch/tpu_pod.py create $TPU --capacity=spot
  python launch/tpu_pod.py install $TPU --upload=Qwen3-1.7B,gsm8k   # model and data dirs
  python launch/tpu_pod.py train $TPU --config=configs/qwen3_gsm8k.py:tpu_v5p_32,size=1.7b \
      --workdir=gs://BUCKET/qwen3_gsm8k -- --config.train.steps=100
  python launch/tpu_pod.py delete $TPU

Commands:
  create   reuse the slice if `describe` finds one of the same accelerator type (starting
           it if it is stopped), else create it.
  install  copy this working tree (a tarball without .git, .venv, workdir) to every worker,
           unpack it in ~/jaxrl_llm and `pip install -e .[EXTRAS] jax[tpu]` there; with
           --pip_spec, pip install that spec instead. --upload copies local files or
           directories (a model, data) into ~/jaxrl_llm on every worker.
  train    start `python -m launch.train` in ~/jaxrl_llm on every worker, in the background
           (nohup; each worker writes its own train.log and train.pid), with --multihost on a
           multi-host slice so that JAX finds the other workers; then follow worker 0's log.
           Arguments after `--` go to launch.train as they are (config overrides).
  logs     follow worker 0's log (Ctrl-C stops following; the run goes on).
  halt     SIGTERM the run on every worker: it writes a checkpoint and exits 75; `train`
           with the same arguments resumes it.
  stop     stop the slice (the TPU API stops single-host slices only).
  delete   delete the slice.

--dry-run prints every command (the gcloud calls, and the local `tar` of `install`) and
runs none. On a multi-host slice the workdir must be one directory every worker sees,
a gs:// bucket: orbax writes each checkpoint from all processes into one directory, so
per-host local directories would each hold a part of it (--shared_workdir accepts a
local path that is a shared mount, e.g. Filestore).

Slices. An accelerator type names the TPU generation and a count: TensorCores for v4 and
v5p (2 per chip), chips for v5e (`v5litepod-N`) and v6e. A multi-host slice is made of
VMs ("workers") with 4 chips each; JAX sees one device per chip. So v5litepod-16 is 16
chips on 4 workers and v5p-32 is 16 chips on 4 workers (Cloud TPU docs: the v5p table at
https://cloud.google.com/tpu/docs/v5p lists 2x2x1 = 8 cores, 4 chips, 1 host; the v5e VM
types at https://cloud.google.com/tpu/docs/v5e are 1, 4 and 8 chips, a multi-host slice
using the 4-chip ct5lp-hightpu-4t; runtimes from https://cloud.google.com/tpu/docs/runtimes).
"""
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from absl import app, flags

COMMANDS = ("create", "install", "train", "logs", "halt", "stop", "delete")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOTE_DIR = "jaxrl_llm"  # under the home directory of every worker
TARBALL = "jaxrl_llm_src.tar.gz"
LOG, PID = f"{REMOTE_DIR}/train.log", f"{REMOTE_DIR}/train.pid"
TAR_EXCLUDES = (".git", ".venv", "workdir", "__pycache__", "*.egg-info", ".pytest_cache")


@dataclasses.dataclass(frozen=True)
class Family:
  """A TPU generation: how to read its accelerator type, and its runtime (software version)."""
  cores_per_chip: int  # what the count in the accelerator type counts, per chip
  single_host_chips: int  # the largest slice that is one VM
  runtime: str


CHIPS_PER_WORKER = 4  # every VM of a multi-host slice, for all families below
FAMILIES = {
    "v4": Family(2, 4, "tpu-ubuntu2204-base"),
    "v5p": Family(2, 4, "v2-alpha-tpuv5"),
    "v5litepod": Family(1, 8, "v2-alpha-tpuv5-lite"),  # v5e
    "v6e": Family(1, 8, "v2-alpha-tpuv6e"),
}

_NAME = flags.DEFINE_string("name", None, "Name of the TPU VM slice.")
_ZONE = flags.DEFINE_string("zone", None, "Zone of the slice, e.g. us-east5-a.")
_PROJECT = flags.DEFINE_string("project", "", "Google Cloud project ('' = gcloud's default).")
_ACCELERATOR = flags.DEFINE_string(
    "accelerator", None, "Accelerator type, e.g. v5litepod-16 (v5e) or v5p-32; needed by "
    "create, train and stop.")
_RUNTIME = flags.DEFINE_string("runtime_version", "", "TPU software version ('' = the one "
                               "Google lists for JAX on this generation).")
_CAPACITY = flags.DEFINE_enum("capacity", "on_demand", ["on_demand", "spot", "preemptible"],
                              "Provisioning: spot and preemptible cost less and can be taken "
                              "away (SIGTERM: the run checkpoints; `train` again resumes).")
_PIP_SPEC = flags.DEFINE_string("pip_spec", "", "install: pip install this (a wheel, a git URL) "
                                "instead of copying the working tree.")
_EXTRAS = flags.DEFINE_string("extras", "gcs", "install: extras of jaxrl_llm to install "
                              "(gcs: gs:// paths).")
_UPLOAD = flags.DEFINE_list("upload", [], "install: local files or directories to copy into "
                            f"~/{REMOTE_DIR} on every worker (a model directory, data).")
_CONFIG = flags.DEFINE_string("config", None, "train: config file, path[:arg], relative to "
                              "the repository root.")
_WORKDIR = flags.DEFINE_string("workdir", None, "train: the run's workdir, gs://BUCKET/PATH.")
_SHARED_WORKDIR = flags.DEFINE_bool("shared_workdir", False, "train: accept a local --workdir "
                                    "on a multi-host slice (it is a mount every worker shares).")
_FOLLOW = flags.DEFINE_bool("follow", True, "train: follow worker 0's log after starting.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the commands instead of running them.")
flags.DEFINE_alias("dry-run", "dry_run")  # gcloud's spelling
flags.mark_flags_as_required(["name", "zone"])


# --- slices ----------------------------------------------------------------------------------------
def _family(accelerator: str) -> tuple[Family, int]:
  """The family and the count of an accelerator type such as 'v5p-32'."""
  prefix, _, count = accelerator.rpartition("-")
  if prefix not in FAMILIES or not count.isdigit() or int(count) < 1:
    raise ValueError(f"--accelerator={accelerator!r}: expected one of "
                     f"{', '.join(f'{p}-N' for p in FAMILIES)}, e.g. v5litepod-16 or v5p-32")
  return FAMILIES[prefix], int(count)


def num_chips(accelerator: str) -> int:
  family, count = _family(accelerator)
  if count % family.cores_per_chip:
    raise ValueError(f"--accelerator={accelerator!r}: the count is TensorCores, "
                     f"{family.cores_per_chip} per chip: expected a multiple of "
                     f"{family.cores_per_chip}")
  return count // family.cores_per_chip


def num_workers(accelerator: str) -> int:
  """VMs of the slice: one up to a single host's chips, else 4 chips each."""
  chips = num_chips(accelerator)
  return 1 if chips <= _family(accelerator)[0].single_host_chips else chips // CHIPS_PER_WORKER


# --- commands ----------------------------------------------------------------------------------------
def gcloud(verb: str, *args: str, positional: tuple[str, ...] | None = None) -> list[str]:
  """`gcloud compute tpus tpu-vm VERB NAME --zone=Z [--project=P] ARGS`.

  `positional` replaces NAME (scp names the TPU inside its source or destination).
  """
  project = [f"--project={_PROJECT.value}"] if _PROJECT.value else []
  return ["gcloud", "compute", "tpus", "tpu-vm", verb,
          *((_NAME.value,) if positional is None else positional), f"--zone={_ZONE.value}",
          *project, *args]


def ssh(worker: str, command: str) -> list[str]:
  return gcloud("ssh", f"--worker={worker}", f"--command={command}")


def scp(source: str, destination: str, recurse: bool = False) -> list[str]:
  """Copies a local path to every worker (`destination` is relative to the home directory)."""
  return gcloud("scp", "--worker=all", *(["--recurse"] if recurse else []),
                positional=(source, f"{_NAME.value}:{destination}"))


def describe() -> list[str]:
  return gcloud("describe", "--format=value(state,acceleratorType)")


def create_command(accelerator: str) -> list[str]:
  runtime = _RUNTIME.value or _family(accelerator)[0].runtime
  capacity = _CAPACITY.value
  return gcloud("create", f"--accelerator-type={accelerator}", f"--version={runtime}",
                *([f"--{capacity}"] if capacity != "on_demand" else []))


def install_commands() -> list[list[str]]:
  pip = "python3 -m pip install"
  if _PIP_SPEC.value:
    steps = [ssh("all", f"mkdir -p {REMOTE_DIR} && {pip} -U pip && "
                        f"{pip} {shlex.quote(_PIP_SPEC.value)} 'jax[tpu]'")]
  else:
    tarball = os.path.join(tempfile.gettempdir(), TARBALL)
    extras = f"[{_EXTRAS.value}]" if _EXTRAS.value else ""
    steps = [
        ["tar", "-czf", tarball, *(f"--exclude={p}" for p in TAR_EXCLUDES), "-C", REPO, "."],
        scp(tarball, TARBALL),
        ssh("all", f"mkdir -p {REMOTE_DIR} && tar -xzf {TARBALL} -C {REMOTE_DIR} && "
                   f"rm {TARBALL} && cd {REMOTE_DIR} && {pip} -U pip && "
                   f"{pip} -e {shlex.quote('.' + extras)} 'jax[tpu]'"),
    ]
  for path in _UPLOAD.value:
    steps.append(scp(path, f"{REMOTE_DIR}/", recurse=os.path.isdir(path)))
  return steps


def train_command(accelerator: str, extra_args: list[str]) -> list[str]:
  """Starts launch.train on every worker, unless one is running there already."""
  workers = num_workers(accelerator)
  args = ["python3", "-m", "launch.train", *(["--multihost"] if workers > 1 else []),
          f"--config={_CONFIG.value}", f"--workdir={_WORKDIR.value}", *extra_args]
  running = f"test -f {PID} && kill -0 $(cat {PID}) 2>/dev/null"
  # `;`, not `&&`, before nohup: `a && b &` would background a subshell, and $! (the pid that
  # `halt` signals) would be the subshell's, not the trainer's.
  return ssh("all", f"if {running}; then echo \"a run is going: pid $(cat {PID})\"; exit 1; fi; "
                    f"cd {REMOTE_DIR} || exit 1; "
                    f"nohup {shlex.join(args)} > train.log 2>&1 < /dev/null & echo $! > train.pid")


def follow_command() -> list[str]:
  return ssh("0", f"tail -n 100 -F {LOG}")


def halt_command() -> list[str]:
  return ssh("all", f"kill -TERM $(cat {PID})")


# --- running them ------------------------------------------------------------------------------------
def _usage_error(message: str):
  print(f"tpu_pod: {message}", file=sys.stderr)
  sys.exit(2)


def _run(cmd: list[str], capture: bool = False) -> subprocess.CompletedProcess | None:
  """Runs (or, with --dry-run, prints) one command; a failure ends the program."""
  print(("" if _DRY_RUN.value else "+ ") + shlex.join(cmd), flush=True)
  if _DRY_RUN.value:
    return None
  try:
    return subprocess.run(cmd, check=not capture, text=True, capture_output=capture)
  except subprocess.CalledProcessError as e:
    print(f"tpu_pod: the command above failed with exit status {e.returncode}", file=sys.stderr)
    sys.exit(e.returncode)


def _follow():
  try:
    _run(follow_command())
  except KeyboardInterrupt:
    print(f"\nStopped following the log; the run goes on. Again: python launch/tpu_pod.py logs "
          f"--name={_NAME.value} --zone={_ZONE.value}", file=sys.stderr)


def create(accelerator: str):
  if _DRY_RUN.value:
    print(f"# create only if the describe below finds no TPU named {_NAME.value!r}")
  found = _run(describe(), capture=True)
  if found is not None and found.returncode == 0:
    state, _, existing = found.stdout.strip().partition("\t")
    if existing != accelerator:
      _usage_error(f"a TPU named {_NAME.value!r} already exists with accelerator type "
                   f"{existing!r}, not {accelerator!r}: delete it or choose another --name")
    print(f"Reusing TPU {_NAME.value!r} ({existing}, {state}).")
    if state == "STOPPED":
      _run(gcloud("start"))
    return
  if found is not None and "NOT_FOUND" not in found.stderr:
    print(found.stderr, file=sys.stderr)
    sys.exit(found.returncode)
  _run(create_command(accelerator))


def _check_args(argv) -> tuple[str, list[str], int | None]:
  """The command, its extra arguments and the slice's worker count; exits 2 on a bad flag."""
  if len(argv) < 2 or argv[1] not in COMMANDS:
    _usage_error(f"expected a command, one of {', '.join(COMMANDS)}; got {argv[1:2]}")
  command, extra_args = argv[1], argv[2:]
  if extra_args and command != "train":
    _usage_error(f"unexpected arguments {extra_args}: only train passes arguments (after --)")
  needs = {"create": ["accelerator"], "train": ["accelerator", "config", "workdir"],
           "stop": ["accelerator"]}.get(command, [])
  missing = [f"--{name}" for name in needs if flags.FLAGS[name].value is None]
  if missing:
    _usage_error(f"{command} needs {', '.join(missing)}")
  accelerator, workers = _ACCELERATOR.value, None
  if accelerator:
    try:
      workers = num_workers(accelerator)
    except ValueError as e:
      _usage_error(str(e))
  if command == "train" and workers > 1 and not _WORKDIR.value.startswith("gs://") and (
      not _SHARED_WORKDIR.value):
    _usage_error(f"--workdir={_WORKDIR.value!r} is a local path, but {accelerator} has "
                 f"{workers} workers: each would write its own part of every checkpoint "
                 "(orbax needs one directory all processes share): expected gs://BUCKET/PATH "
                 "(or --shared_workdir for a shared mount)")
  if command == "stop" and workers > 1:
    _usage_error(f"{accelerator} has {workers} workers; the TPU API stops single-host slices "
                 "only: `halt` the run and `delete` the slice instead")
  if not _DRY_RUN.value and shutil.which("gcloud") is None:
    _usage_error("gcloud is not on PATH: install the Google Cloud CLI "
                 "(https://cloud.google.com/sdk/docs/install) and run `gcloud auth login`, or "
                 "pass --dry-run to print the commands")
  return command, extra_args, workers


def main(argv):
  command, extra_args, workers = _check_args(argv)
  accelerator = _ACCELERATOR.value
  if accelerator:
    runtime = _RUNTIME.value or _family(accelerator)[0].runtime
    print(f"# {accelerator}: {num_chips(accelerator)} chips on {workers} worker(s), "
          f"runtime {runtime}")
  if command == "create":
    create(accelerator)
  elif command == "install":
    for cmd in install_commands():
      _run(cmd)
  elif command == "train":
    _run(train_command(accelerator, extra_args))
    if _FOLLOW.value:
      _follow()
  elif command == "logs":
    _follow()
  elif command == "halt":
    _run(halt_command())
  elif command == "stop":
    _run(gcloud("stop"))
  elif command == "delete":
    _run(gcloud("delete", "--quiet"))


if __name__ == "__main__":
  app.run(main)
