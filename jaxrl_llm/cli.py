r"""`jaxrl-llm-train`: trains with a config, parsing flags and then making one library call.

  jaxrl-llm-train --config=grpo:runlocal --workdir=/tmp/grpo --config.train.steps=20
  python -m launch.train --config=configs/grpo.py:runlocal --workdir=/tmp/grpo \
      --config.train.steps=200 --config.algo.kl.coef=0

`--config` is a preset name (`grpo`, `ppo:runlocal`; `jaxrl_llm.config.presets.names()`)
or a config file (`path/to/file.py[:arg]`); `--config.x.y=v` overrides a field.

Several processes (hosts): run the same command on every host, joined by JAX's own
runtime (`jax.distributed`), e.g. two processes on one machine:

  jaxrl-llm-train ... --coordinator_address=127.0.0.1:12355 --num_processes=2 --process_id=0
  jaxrl-llm-train ... --coordinator_address=127.0.0.1:12355 --num_processes=2 --process_id=1

The three flags may come from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID instead; on a Cloud TPU pod (or SLURM) `--multihost` lets JAX find them
(launch/tpu_pod.py starts this command so on every worker of a TPU slice).

Exit status: 0 when the run finished; 75 (EX_TEMPFAIL) when SIGTERM or a Ctrl-C stopped
it after writing a checkpoint (run the same command again to resume); 130 when a second
Ctrl-C stopped it at once; 2 for a bad flag, config file or config value, or a workdir
that cannot be written, or data that cannot be trained on (one line on stderr, before any
model loads); 1 on any other error (one line naming the cause last; the traceback in
WORKDIR/error.log, and on screen with --verbose).
"""
import sys
import traceback

from absl import flags

from jaxrl_llm import command_line

_CONFIG = command_line.config_flag()
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and exports.")
_JOIN = command_line.process_flags()  # --coordinator_address, --num_processes, ...
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Check the config, the model directory and the "
                             "data, print the plan, and exit: nothing is loaded or written. A "
                             "recipe's mesh is checked against the TPU slice it names "
                             "(config.mesh.topology), else against the devices here.")
flags.DEFINE_alias("dry-run", "dry_run")  # the pod launcher's and gcloud's spelling
_VERBOSE = flags.DEFINE_bool("verbose", False, "On an error once training has started, also "
                             "print its traceback (it is always written to WORKDIR/error.log).")
_RESUME_WITH_CHANGES = flags.DEFINE_bool(
    "resume_with_changes", False, "Resume a workdir whose checkpoint was written by another "
    "algorithm or model (config.algo, config.model) instead of refusing it.")
flags.mark_flags_as_required(["config", "workdir"])


def main():
  # pylint: disable=g-import-not-at-top  (after flag parsing)
  from jaxrl_llm import training
  from jaxrl_llm.training import guards
  try:
    if _DRY_RUN.value:
      _dry_run(_CONFIG.value)
      return
    training.train(_CONFIG.value, _WORKDIR.value, print_config=True,
                   resume_with_changes=_RESUME_WITH_CHANGES.value)
  except guards.Preempted as e:
    print(e, file=sys.stderr)
    sys.exit(guards.PREEMPTED_EXIT_CODE)
  except KeyboardInterrupt as e:  # Ctrl-C twice, or once before training started
    why = str(e) or "no checkpoint written"  # a plain KeyboardInterrupt's str() is ""
    print(f"aborted (Ctrl-C): {why}; the steps since the last one are lost", file=sys.stderr)
    sys.exit(130)


def _failed(error: Exception) -> str:
  """The run's own failure, once training started: its traceback in WORKDIR/error.log (and
  on screen with --verbose), and one line naming the cause last."""
  log = _write_error_log(_WORKDIR.value)
  if _VERBOSE.value:
    traceback.print_exc()
  return f"the run failed: {_causes(error)} (traceback in {log})"


def _dry_run(config) -> None:
  """Checks the config, the model directory and the data, and prints the plan. A recipe
  that names its TPU slice (config.mesh.topology) has its mesh checked against the slice's
  chips (`chips.slice_chips`: no TPU or libtpu needed), not against this host's devices."""
  # pylint: disable=g-import-not-at-top
  import jax
  from jaxrl_llm import config as config_lib
  from jaxrl_llm import training
  from jaxrl_llm.aot import chips
  n = jax.device_count()
  here = f"the {n} {jax.devices()[0].platform} device{'s' * (n != 1)} here"
  devices, mesh = None, f"the mesh was checked against {here}"
  if config.mesh.topology:
    topology, slices = config.mesh.topology, config.mesh.num_slices
    try:
      devices = chips.slice_chips(topology, slices,
                                  ("config.mesh.topology", "config.mesh.num_slices"))
    except chips.TopologyError as e:
      raise config_lib.ConfigError(str(e)) from e
    name = topology + (f" x {slices} slices" if slices > 1 else "")
    mesh = (f"the mesh was checked against {name}'s {len(devices)} chips "
            f"(config.mesh.topology), not {here}")
  config_lib.validate(config, devices, data=True)
  print(f"{config}\n{training.make_plan(config).describe()}\n{mesh}\ndry run: the config, "
        "the model directory and the data check out; nothing was loaded or written")


def _causes(error: BaseException) -> str:
  """'Outer: message; caused by Inner: message', on one line: the root cause last."""
  chain, seen = [], set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    chain.append(f"{type(error).__name__}: {error}")
    error = error.__cause__ or error.__context__
  return "; caused by ".join(" ".join(str(c).split()) for c in chain)


def _write_error_log(workdir: str) -> str:
  """The current exception's traceback in WORKDIR/error.log (error.N.log for process N > 0);
  returns where it went ('stderr' when the workdir cannot take it)."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxrl_llm import paths  # pylint: disable=g-import-not-at-top
  index = jax.process_index()
  path = paths.join(workdir, "error.log" if index == 0 else f"error.{index}.log")
  try:
    paths.write_atomic(path, traceback.format_exc())
    return path
  except (OSError, ValueError):
    traceback.print_exc()
    return "stderr"


def run():
  command_line.run(main, _CONFIG, join=_JOIN, failed=_failed)


if __name__ == "__main__":
  run()
