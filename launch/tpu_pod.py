r"""Runs a config on a Cloud TPU VM slice with `gcloud`: create, install, train, logs, delete.

From a clone of this repository, on a machine with the Google Cloud CLI (`gcloud auth
login` done; the project from --project or gcloud's default). docs/tpu.md goes through it
from an empty Google Cloud project (API, quota, bucket, model and data on gs://).

  TPU="--name=qwen3-grpo --zone=us-east5-a --accelerator=v5p-32 --queued"
  python launch/tpu_pod.py create $TPU --capacity=spot   # again until it says ACTIVE
  python launch/tpu_pod.py install $TPU
  python launch/tpu_pod.py train $TPU --config=configs/qwen3_gsm8k.py:tpu_v5p_32,size=1.7b \
      --workdir=gs://BUCKET/qwen3_gsm8k -- --config.model.path=gs://BUCKET/Qwen3-1.7B \
      --config.data.source='jsonl:gs://BUCKET/gsm8k/{split}.jsonl'
  python launch/tpu_pod.py halt $TPU     # the run checkpoints and exits 75
  python launch/tpu_pod.py delete $TPU

  One host instead: --zone=us-west4-a --accelerator=v5litepod-8 with :tpu_v5e_8,size=1.7b.

Commands:
  create   make the slice, or reuse the one of that name. `describe` decides, by its state:
           none: create it (gcloud waits until it is READY); READY: reuse it; CREATING,
           STARTING, RESTARTING, REPAIRING, REIMAGING: reuse it, not ready yet; STOPPED:
           start it; PREEMPTED, TERMINATED: delete it and create it anew (a preempted Spot
           TPU cannot be restarted, only recreated); any other state (DELETING, STOPPING):
           an error, try again later. A slice of another accelerator type is an error.
           With --queued, through a queued resource of the same name whose node has that
           name (Google's recommended way: the request waits for capacity instead of
           failing when the zone has none). By the request's state: none: queue it;
           WAITING_FOR_RESOURCES, ACCEPTED, PROVISIONING, CREATING: still queued, run
           `create` again later; ACTIVE: reuse its node; FAILED, SUSPENDING, SUSPENDED (a
           preempted Spot slice's request is SUSPENDED): delete it (--force: its node too)
           and queue anew; any other state: an error, try again later.
  install  copy this working tree (a tarball without .git, .venv, workdir) to every worker,
           unpack it in ~/jaxrl_llm, make the virtual environment ~/jaxrl_llm/.venv with a
           Python >= 3.11 and `pip install -e .[EXTRAS] 'jax[tpu]>=0.10'` into it; with
           --pip_spec, pip install that spec (and jax[tpu]) into that venv instead. Why a
           venv: TPU VM images are Ubuntu 22.04, whose python3 is 3.10: pip finds only an
           old jax there, and this package needs 3.11 (see `venv_command`). --upload copies
           local files or directories (a model, data) into ~/jaxrl_llm on every worker
           (gs:// model and data paths need no copy: the trainer reads them itself).
  train    start `.venv/bin/jaxrl-llm-train` (what `python -m launch.train` runs) in
           ~/jaxrl_llm on every worker, in the background (nohup; each worker writes its
           own train.log and train.pid; a second start while one runs is refused), with
           --multihost on a multi-host slice so that JAX finds the other workers; then
           follow worker 0's log. Arguments after `--` go to the trainer as they are
           (config overrides).
  logs     follow worker 0's log (Ctrl-C stops following; the run goes on).
  halt     SIGTERM the run on every worker: it writes a checkpoint and exits 75; `train`
           with the same arguments resumes it. Halt before `delete`, which kills the VMs
           without a checkpoint.
  stop     stop the slice (the TPU API stops single-host slices only).
  delete   delete the slice; with --queued, its queued resource (--force: and its node).

--dry-run prints every command (the gcloud calls, and the local `tar` of `install`) and
runs none; `create` then prints the describe it would run and the create that follows
when there is no slice. On a multi-host slice the workdir must be one directory every
worker sees, a gs:// bucket: orbax writes each checkpoint from all processes into one
directory, so per-host local directories would each hold a part of it (--shared_workdir
accepts a local path that is a shared mount, e.g. Filestore).

Zones. `create`, `install` and `train` refuse a --zone that the ZONES table here does not
list for the accelerator's generation (--any_zone skips the check: Google adds zones).
Workers without external IP addresses: --internal_ip (from a machine in the slice's VPC
network) or --tunnel_through_iap (through Identity-Aware Proxy, with gcloud's alpha
commands) on every ssh and scp.

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
VENV = ".venv"  # in ~/jaxrl_llm on every worker
TRAINER = f"{VENV}/bin/jaxrl-llm-train"  # the console script setup.py installs (launch.train)
JAX_TPU = "jax[tpu]>=0.10"  # the floor of setup.py's jax; older jax wheels lack what we use
MIN_PYTHON = (3, 11)  # setup.py's python_requires
PYTHONS = ("python3.13", "python3.12", "python3.11")  # looked for on a worker's PATH, in order
UV_INSTALLER = "https://astral.sh/uv/install.sh"  # installs uv into ~/.local/bin
UV_PYTHON = "3.12"  # what uv makes the venv with when the worker has no PYTHONS


@dataclasses.dataclass(frozen=True)
class Family:
  """A TPU generation: how to read its accelerator type, and its runtime (software version)."""
  cores_per_chip: int  # what the count in the accelerator type counts, per chip
  single_host_chips: int  # the largest slice that is one VM
  runtime: str
  generation: str  # Google's name for it, where the accelerator type says another (v5e)


CHIPS_PER_WORKER = 4  # every VM of a multi-host slice, for all families below
FAMILIES = {
    "v4": Family(2, 4, "tpu-ubuntu2204-base", "v4"),
    "v5p": Family(2, 4, "v2-alpha-tpuv5", "v5p"),
    "v5litepod": Family(1, 8, "v2-alpha-tpuv5-lite", "v5e"),
    "v6e": Family(1, 8, "v2-alpha-tpuv6e", "v6e"),
}
# Zones that offer each family, from Google's "TPU regions and zones" page (ZONES_URL, read
# 2026-11). Only these were checked: the page lists more regions (outside the US too) and
# changes over time, so a zone missing here may offer the family now (--any_zone).
ZONES_URL = "https://cloud.google.com/tpu/docs/regions-zones"
ZONES = {
    "v4": ("us-central2-b",),
    "v5p": ("us-central1-a", "us-east5-a"),
    "v5litepod": ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
    "v6e": ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
}

# Node states (`describe --format=value(state)`), and what `create` does in each.
NODE_NOT_READY = ("CREATING", "STARTING", "RESTARTING", "REPAIRING", "REIMAGING")  # reuse
NODE_GONE = ("PREEMPTED", "TERMINATED")  # cannot be restarted: delete, create anew
# Queued-resource states (`describe --format=value(state.state)`).
QUEUED_WAITING = ("WAITING_FOR_RESOURCES", "ACCEPTED", "PROVISIONING", "CREATING")
QUEUED_GONE = ("FAILED", "SUSPENDING", "SUSPENDED")  # delete --force, queue anew
CAPACITIES = ("on_demand", "spot")

_NAME = flags.DEFINE_string("name", None, "Name of the TPU VM slice (and of its queued "
                            "resource with --queued).")
_ZONE = flags.DEFINE_string("zone", None, "Zone of the slice, e.g. us-east5-a (v5p, v6e) or "
                            "us-west4-a (v5e); see ZONES in this file.")
_PROJECT = flags.DEFINE_string("project", "", "Google Cloud project ('' = gcloud's default).")
_ACCELERATOR = flags.DEFINE_string(
    "accelerator", None, "Accelerator type, e.g. v5litepod-16 (v5e) or v5p-32; needed by "
    "create, train and stop.")
_RUNTIME = flags.DEFINE_string("runtime_version", "", "TPU software version ('' = the one "
                               "Google lists for JAX on this generation).")
# A string, not an enum: `preemptible` gets a one-line error that says what replaced it.
_CAPACITY = flags.DEFINE_string("capacity", "on_demand", "create: on_demand or spot. Spot costs "
                                "less and can be preempted (the run gets SIGTERM and "
                                "checkpoints; `create` again recreates the slice, `train` "
                                "again resumes). Spot and on-demand TPU quotas are separate.")
_QUEUED = flags.DEFINE_bool("queued", False, "create, delete: go through a queued resource of "
                            "the same name, which waits for capacity instead of failing "
                            "(Google's recommendation).")
_ANY_ZONE = flags.DEFINE_bool("any_zone", False, "create, install, train: skip the check that "
                              "--zone is one that ZONES in this file lists for the "
                              "accelerator's generation.")
_INTERNAL_IP = flags.DEFINE_bool("internal_ip", False, "ssh and scp to the workers' internal IP "
                                 "addresses (from a machine in the slice's VPC network).")
_IAP = flags.DEFINE_bool("tunnel_through_iap", False, "ssh and scp through Identity-Aware Proxy "
                         "(workers without external IPs, reached from outside their network; "
                         "needs a firewall rule for IAP and gcloud's alpha commands, the only "
                         "tpu-vm ssh and scp with --tunnel-through-iap).")
_PIP_SPEC = flags.DEFINE_string("pip_spec", "", "install: pip install this (a wheel, a git URL) "
                                "into the workers' venv instead of copying the working tree.")
_EXTRAS = flags.DEFINE_string("extras", "gcs", "install: extras of jaxrl_llm to install "
                              "(gcs: gs:// paths).")
_PYTHON = flags.DEFINE_string("python", "", "install: the Python (>= 3.11) to make the workers' "
                              "venv with, a name on their PATH or a path, e.g. python3.12 ('' = "
                              "the first of python3.13, python3.12, python3.11 there, else uv's "
                              "Python 3.12).")
_UPLOAD = flags.DEFINE_list("upload", [], "install: local files or directories to copy into "
                            f"~/{REMOTE_DIR} on every worker (a model directory, data).")
_CONFIG = flags.DEFINE_string("config", None, "train: config file, path[:arg], relative to "
                              f"~/{REMOTE_DIR} on the workers (the repository root).")
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


def zone_error(accelerator: str, zone: str) -> str | None:
  """Why `zone` does not offer `accelerator`, as far as ZONES knows; None if it does."""
  prefix = accelerator.rpartition("-")[0]
  if zone in ZONES[prefix]:
    return None
  generation = FAMILIES[prefix].generation
  named = accelerator if generation == prefix else f"{accelerator} ({generation})"
  return (f"--zone={zone} does not offer {named}: Google lists it in "
          f"{', '.join(ZONES[prefix])} ({ZONES_URL}); pass --any_zone if {zone} offers it now")


# --- commands ----------------------------------------------------------------------------------------
def gcloud(verb: str, *args: str, positional: tuple[str, ...] | None = None,
           group: str = "tpu-vm") -> list[str]:
  """`gcloud compute tpus GROUP VERB NAME --zone=Z [--project=P] ARGS`.

  GROUP is tpu-vm (the slice, a "node") or queued-resources. `positional` replaces NAME
  (scp names the TPU inside its source or destination).
  """
  project = [f"--project={_PROJECT.value}"] if _PROJECT.value else []
  return ["gcloud", "compute", "tpus", group, verb,
          *((_NAME.value,) if positional is None else positional), f"--zone={_ZONE.value}",
          *project, *args]


def _reach(cmd: list[str]) -> list[str]:
  """An ssh or scp command with the route --internal_ip or --tunnel_through_iap asks for.

  gcloud's tpu-vm ssh and scp take --tunnel-through-iap in its alpha track only (the GA
  commands have --internal-ip alone), so IAP runs them as `gcloud alpha ...`.
  """
  if _INTERNAL_IP.value:
    return [*cmd, "--internal-ip"]
  if _IAP.value:
    return [cmd[0], "alpha", *cmd[1:], "--tunnel-through-iap"]
  return cmd


def ssh(worker: str, command: str) -> list[str]:
  return _reach(gcloud("ssh", f"--worker={worker}", f"--command={command}"))


def scp(source: str, destination: str, recurse: bool = False) -> list[str]:
  """Copies a local path to every worker (`destination` is relative to the home directory)."""
  return _reach(gcloud("scp", "--worker=all", *(["--recurse"] if recurse else []),
                       positional=(source, f"{_NAME.value}:{destination}")))


def describe() -> list[str]:
  return gcloud("describe", "--format=value(state,acceleratorType)")


def queued_describe(fmt: bool = True) -> list[str]:
  """The queued resource's state (ACTIVE, WAITING_FOR_RESOURCES, ...); all of it without `fmt`."""
  return gcloud("describe", *(["--format=value(state.state)"] if fmt else []),
                group="queued-resources")


def _runtime(accelerator: str) -> str:
  return _RUNTIME.value or _family(accelerator)[0].runtime


def _spot() -> list[str]:
  return ["--spot"] if _CAPACITY.value == "spot" else []


def create_command(accelerator: str) -> list[str]:
  return gcloud("create", f"--accelerator-type={accelerator}",
                f"--version={_runtime(accelerator)}", *_spot())


def queued_create_command(accelerator: str) -> list[str]:
  """Queues a request for the slice; its node gets the same name as the request."""
  return gcloud("create", f"--node-id={_NAME.value}", f"--accelerator-type={accelerator}",
                f"--runtime-version={_runtime(accelerator)}", *_spot(),
                group="queued-resources")


def delete_command() -> list[str]:
  if _QUEUED.value:  # --force: the node too (without it, only a request with no node goes)
    return gcloud("delete", "--force", "--quiet", group="queued-resources")
  return gcloud("delete", "--quiet")


def venv_command() -> str:
  """POSIX shell, run in ~/jaxrl_llm: makes .venv with a Python >= 3.11 unless one is there.

  Why: TPU VM images (tpu-ubuntu2204-base, v2-alpha-tpuv5, -tpuv5-lite, -tpuv6e) are Ubuntu
  22.04, whose python3 is 3.10: pip there resolves an old jax (0.6.x), and this package
  needs Python >= 3.11. The interpreter: --python, else the first of PYTHONS on the
  worker's PATH. When there is none, or it cannot make a venv (Ubuntu packages the venv
  module apart, as python3.X-venv), uv makes it: installed into ~/.local/bin by its own
  script unless the worker has it, given the interpreter found, or else Python 3.12,
  which uv downloads. `--seed` puts pip into the venv. A .venv that runs Python >= 3.11
  already is kept, so `install` again only updates the packages in it.
  """
  python_ok = f'{VENV}/bin/python -c "import sys; sys.exit(sys.version_info < {MIN_PYTHON})"'
  if _PYTHON.value:
    find = f"py={shlex.quote(_PYTHON.value)}"
  else:
    find = f"py=$({' || '.join(f'command -v {p}' for p in PYTHONS)})"
  uv = (f'export PATH="$HOME/.local/bin:$PATH"; '
        f"{{ command -v uv >/dev/null || curl -LsSf {UV_INSTALLER} | sh; }} && "
        f'uv venv --seed --python "${{py:-{UV_PYTHON}}}" {VENV}')
  return (f"if ! {python_ok} 2>/dev/null; then rm -rf {VENV}; {find}; "
          f'if [ -z "$py" ] || ! "$py" -m venv {VENV}; then rm -rf {VENV}; {uv}; fi; fi')


def install_commands() -> list[list[str]]:
  pip = f"{VENV}/bin/python -m pip install"
  setup = f"{venv_command()} && {pip} -U pip && {pip}"
  if _PIP_SPEC.value:
    steps = [ssh("all", f"mkdir -p {REMOTE_DIR} && cd {REMOTE_DIR} && {setup} "
                        f"{shlex.quote(_PIP_SPEC.value)} {shlex.quote(JAX_TPU)}")]
  else:
    tarball = os.path.join(tempfile.gettempdir(), TARBALL)
    extras = f"[{_EXTRAS.value}]" if _EXTRAS.value else ""
    steps = [
        ["tar", "-czf", tarball, *(f"--exclude={p}" for p in TAR_EXCLUDES), "-C", REPO, "."],
        scp(tarball, TARBALL),
        ssh("all", f"mkdir -p {REMOTE_DIR} && tar -xzf {TARBALL} -C {REMOTE_DIR} && "
                   f"rm {TARBALL} && cd {REMOTE_DIR} && {setup} -e "
                   f"{shlex.quote('.' + extras)} {shlex.quote(JAX_TPU)}"),
    ]
  for path in _UPLOAD.value:
    steps.append(scp(path, f"{REMOTE_DIR}/", recurse=os.path.isdir(path)))
  return steps


def train_command(accelerator: str, extra_args: list[str]) -> list[str]:
  """Starts the venv's trainer on every worker, unless one is running there already."""
  workers = num_workers(accelerator)
  args = [TRAINER, *(["--multihost"] if workers > 1 else []),
          f"--config={_CONFIG.value}", f"--workdir={_WORKDIR.value}", *extra_args]
  running = f"test -f {PID} && kill -0 $(cat {PID}) 2>/dev/null"
  # `;`, not `&&`, before nohup: `a && b &` would background a subshell, and $! (the pid that
  # `halt` signals) would be the subshell's, not the trainer's.
  return ssh("all", f"if {running}; then echo \"a run is going: pid $(cat {PID})\"; exit 1; fi; "
                    f"cd {REMOTE_DIR} || exit 1; "
                    f"test -x {TRAINER} || {{ echo \"no ~/{REMOTE_DIR}/{TRAINER}: run "
                    f"install first\" >&2; exit 1; }}; "
                    f"nohup {shlex.join(args)} > train.log 2>&1 < /dev/null & echo $! > train.pid")


def follow_command() -> list[str]:
  return ssh("0", f"tail -n 100 -F {LOG}")


def halt_command() -> list[str]:
  return ssh("all", f"kill -TERM $(cat {PID})")


# --- running them ------------------------------------------------------------------------------------
def _usage_error(message: str):
  print(f"tpu_pod: {message}", file=sys.stderr)
  sys.exit(2)


def _say(message: str):
  """A line for the user (a comment under --dry-run, whose other lines are commands)."""
  print(("# " if _DRY_RUN.value else "") + message, flush=True)


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


def _lookup(cmd: list[str]) -> str | None:
  """What a `describe` prints, or None when there is no such resource (and under --dry-run)."""
  found = _run(cmd, capture=True)
  if found is None:
    return None
  if found.returncode == 0:
    return found.stdout.strip()
  if "NOT_FOUND" in found.stderr:
    return None
  print(found.stderr, file=sys.stderr, end="")  # another failure: gcloud's own message
  sys.exit(found.returncode)


def _follow():
  try:
    _run(follow_command())
  except KeyboardInterrupt:
    print(f"\nStopped following the log; the run goes on. Again: python launch/tpu_pod.py logs "
          f"--name={_NAME.value} --zone={_ZONE.value}", file=sys.stderr)


def _check_accelerator(existing: str, accelerator: str):
  if existing != accelerator:
    _usage_error(f"a TPU named {_NAME.value!r} already exists with accelerator type "
                 f"{existing!r}, not {accelerator!r}: delete it or choose another --name")


def create(accelerator: str):
  """Reuses, starts or replaces the slice of that name by its state, or creates it."""
  if _DRY_RUN.value:
    print(f"# create only if the describe below finds no TPU named {_NAME.value!r}")
  found = _lookup(describe())
  if found is not None:
    state, _, existing = found.partition("\t")
    _check_accelerator(existing, accelerator)
    if state == "READY":
      _say(f"Reusing TPU {_NAME.value!r} ({existing}, READY).")
      return
    if state in NODE_NOT_READY:
      _say(f"Reusing TPU {_NAME.value!r} ({existing}, {state}): not ready yet; it is when "
           f"`{shlex.join(describe())}` says READY.")
      return
    if state == "STOPPED":
      _say(f"Reusing TPU {_NAME.value!r} ({existing}, STOPPED): starting it.")
      _run(gcloud("start"))
      return
    if state not in NODE_GONE:
      _usage_error(f"TPU {_NAME.value!r} is {state}: it can be neither used nor replaced "
                   "while it is; try create again when it is over")
    _say(f"TPU {_NAME.value!r} is {state}: it cannot be restarted (a preempted Spot TPU must "
         "be recreated). Deleting it, then creating it anew.")
    _run(gcloud("delete", "--quiet"))
  _run(create_command(accelerator))


def create_queued(accelerator: str):
  """The same through a queued resource: queues a request, or acts on the one there by state."""
  if _DRY_RUN.value:
    print(f"# queue only if the describe below finds no queued resource named {_NAME.value!r}")
  state = _lookup(queued_describe())
  watch = shlex.join(queued_describe(fmt=False))
  if state == "ACTIVE":
    found = _lookup(describe())
    if found is None:
      _usage_error(f"queued resource {_NAME.value!r} is ACTIVE but there is no TPU named "
                   f"{_NAME.value!r} (another --node-id?): delete it (delete --queued) or "
                   "choose another --name")
    node_state, _, existing = found.partition("\t")
    _check_accelerator(existing, accelerator)
    _say(f"Reusing TPU {_NAME.value!r} ({existing}, {node_state}), the node of queued "
         f"resource {_NAME.value!r} (ACTIVE).")
    return
  if state in QUEUED_WAITING:
    _say(f"Queued resource {_NAME.value!r} is {state}: the TPU is not there yet. Run create "
         f"again later, or watch for state ACTIVE: {watch}")
    return
  if state in QUEUED_GONE:
    _say(f"Queued resource {_NAME.value!r} is {state} (a preempted Spot slice's request is "
         "SUSPENDED): deleting it and its node, then queueing anew.")
    _run(delete_command())
  elif state is not None:
    _usage_error(f"queued resource {_NAME.value!r} is {state}: it can be neither used nor "
                 "replaced while it is; try create again when it is over")
  _run(queued_create_command(accelerator))
  _say(f"Queued. The slice is there when `{watch}` says ACTIVE (create again says so too); "
       "then install.")


def config_error(spec: str) -> str | None:
  """Why the workers could not load `--config` (None: they can), checked here first.

  A preset name or a file relative to the repository root (what the workers run in), with
  its argument after the colon: the file must exist, and where this machine has
  jaxrl_llm (a checkout after `make install`) the config is built, so a misspelt variant
  fails here rather than on every worker.
  """
  name, sep, arg = spec.partition(":")
  if not name.endswith(".py"):
    name = os.path.join("configs", name + ".py")
  path = os.path.join(REPO, name)
  if not os.path.isfile(path):
    return f"--config={spec!r}: no file {name!r} in this repository (expected a preset name " \
           "or a config file relative to its root)"
  try:
    from jaxrl_llm.config import presets  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None  # the launcher's own environment: absl only
  try:
    presets.load(path + sep + arg)
  except Exception as e:  # noqa: BLE001 -- any error of the config file is the user's to see
    return f"--config={spec!r}: {type(e).__name__}: {e}"
  return None


def _check_args(argv) -> tuple[str, list[str], int | None]:
  """The command, its extra arguments and the slice's worker count; exits 2 on a bad flag."""
  if len(argv) < 2 or argv[1] not in COMMANDS:
    _usage_error(f"expected a command, one of {', '.join(COMMANDS)}; got {argv[1:2]}")
  command, extra_args = argv[1], argv[2:]
  if extra_args and command != "train":
    _usage_error(f"unexpected arguments {extra_args}: only train passes arguments (after --)")
  if _CAPACITY.value == "preemptible":
    _usage_error("--capacity=preemptible: preemptible TPUs are the legacy model that Spot VMs "
                 "succeed: use --capacity=spot (or on_demand)")
  if _CAPACITY.value not in CAPACITIES:
    _usage_error(f"--capacity={_CAPACITY.value!r}: expected one of {', '.join(CAPACITIES)}")
  if _INTERNAL_IP.value and _IAP.value:
    _usage_error("--internal_ip and --tunnel_through_iap exclude each other (gcloud takes one): "
                 "--internal_ip from inside the slice's network, --tunnel_through_iap from "
                 "outside it")
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
    if command in ("create", "install", "train") and not _ANY_ZONE.value and (
        error := zone_error(accelerator, _ZONE.value)):
      _usage_error(error)
  if command == "train" and workers > 1 and not _WORKDIR.value.startswith("gs://") and (
      not _SHARED_WORKDIR.value):
    _usage_error(f"--workdir={_WORKDIR.value!r} is a local path, but {accelerator} has "
                 f"{workers} workers: each would write its own part of every checkpoint "
                 "(orbax needs one directory all processes share): expected gs://BUCKET/PATH "
                 "(or --shared_workdir for a shared mount)")
  if command == "train" and (error := config_error(_CONFIG.value)):
    _usage_error(error)
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
    print(f"# {accelerator}: {num_chips(accelerator)} chips on {workers} worker(s), "
          f"runtime {_runtime(accelerator)}")
  if command == "create":
    (create_queued if _QUEUED.value else create)(accelerator)
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
    _run(delete_command())


if __name__ == "__main__":
  if {"-h", "--help", "--helpshort", "--helpfull"} & set(sys.argv[1:]):  # help is a success
    app.usage(shorthelp="--helpfull" not in sys.argv, writeto_stdout=True, exitcode=0)
  app.run(main)
