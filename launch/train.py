r"""Trains with a config file: parses flags, then makes one library call.

  python -m launch.train --config=configs/grpo.py:runlocal --workdir=/tmp/grpo \
      --config.train.steps=200 --config.algo.kl.coef=0

Also installed as the console script `jaxrl-llm-train`.

Several processes (hosts): run the same command on every host, joined by JAX's own
runtime (`jax.distributed`), e.g. two processes on one machine:

  python -m launch.train ... --coordinator_address=127.0.0.1:12355 --num_processes=2 --process_id=0
  python -m launch.train ... --coordinator_address=127.0.0.1:12355 --num_processes=2 --process_id=1

The three flags may come from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID instead; on a Cloud TPU pod (or SLURM) `--multihost` lets JAX find them.

Exit status: 0 when the run finished; 75 (EX_TEMPFAIL) when SIGTERM stopped it after
writing a checkpoint (run the same command again to resume); 1 on an error.
"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (path[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and exports.")
_ADDRESS = flags.DEFINE_string("coordinator_address", "",
                               "host:port of process 0 (several processes); or "
                               "$JAX_COORDINATOR_ADDRESS.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "Processes in the run; or $JAX_NUM_PROCESSES.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "This process's index; or $JAX_PROCESS_ID.")
_MULTIHOST = flags.DEFINE_bool("multihost", False,
                               "Join a multi-process run that JAX detects itself (Cloud TPU "
                               "pods, SLURM, Open MPI, Kubernetes).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # pylint: disable=g-import-not-at-top  (after flag parsing)
  import jax
  from jaxrl_llm import distributed, training
  from jaxrl_llm.training import guards
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  distributed.initialize(_ADDRESS.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         auto_detect=_MULTIHOST.value)
  config = _CONFIG.value
  if jax.process_index() == 0:
    print(config)
  try:
    training.train(config, _WORKDIR.value)
  except guards.Preempted as e:
    print(e, file=sys.stderr)
    sys.exit(guards.PREEMPTED_EXIT_CODE)


def run():
  app.run(main)


if __name__ == "__main__":
  run()
