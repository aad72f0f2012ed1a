"""The two-process runs of tests/training/multiprocess_test.py, all in one start of each
process (a process imports JAX and transformers once, rather than once per run):

  python -m tests.training.multiprocess_runs --config=tests/training/multiprocess_configs.py:smoke \
      --workdir=DIR --coordinator_address=... --num_processes=2 --process_id=I \
      --then=calculator:DIR2 --then=shared:DIR3

The first run is the training command line's own (`jaxrl_llm.cli.main` in the skeleton that
`python -m launch.train` runs: its flags, the config file, joining the processes with
`--coordinator_address`/`--num_processes`/`--process_id`, the config printed by process 0).
Each `--then=NAME:WORKDIR` then trains `multiprocess_configs.get_config(NAME)` in WORKDIR in
the same joined processes. The exit status is the first failing run's (1, its traceback on
stderr), else 0.
"""
from absl import flags

from jaxrl_llm import cli
from jaxrl_llm import command_line

_THEN = flags.DEFINE_multi_string(
    "then", [], "NAME:WORKDIR: after the --config run, train multiprocess_configs' NAME in "
    "WORKDIR in the same processes.")


def main():
  cli.main()  # the command line's run
  # pylint: disable=g-import-not-at-top  (after flag parsing, as cli.main imports)
  from jaxrl_llm import training
  from tests.training import multiprocess_configs
  for spec in _THEN.value:
    name, workdir = spec.split(":", 1)
    training.train(multiprocess_configs.get_config(name), workdir)


if __name__ == "__main__":
  # A failure is its traceback on stderr (no `failed`), which the test prints.
  command_line.run(main, cli._CONFIG, join=cli._JOIN)  # pylint: disable=protected-access
