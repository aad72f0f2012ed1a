"""Every command's skeleton (`run`): absl's start, `--config` (a preset name or a config
file, `--config.x.y=v` overrides), help on stdout with exit status 0, one clear line with
exit status 2 for a bad flag, config file or config value, and the command's own one line
with exit status 1 for any other failure. The commands:

  jaxrl-llm-train     jaxrl_llm.cli         python -m launch.train
  jaxrl-llm-evaluate  jaxrl_llm.eval_cli    python -m launch.evaluate
  jaxrl-llm-compile   jaxrl_llm.aot.cli     python -m launch.compile
  jaxrl-llm-serve     jaxrl_llm.serve_cli   python -m launch.serve
  jaxrl-llm-demo      jaxrl_llm.demo_cli    python -m launch.demo

Each defines its flags (`config_flag`; train and evaluate also `process_flags`, to join
several processes) and a `main()` that reads them, and runs with `run(main, config, ...)`.
"""
from __future__ import annotations

import sys
from typing import Callable

from absl import app, flags, logging
from ml_collections import config_flags

# The flags defined here (`config_flag`, `process_flags`) belong to the command that asks
# for them: its --help lists them with its own.
flags.disclaim_key_flags()

PRESET_OR_FILE = "A preset name (grpo, ppo:runlocal) or a config file (path[:arg])."
HELP_FLAGS = frozenset({"-h", "--help", "--helpshort", "--helpfull"})


def config_flag(help_text: str = PRESET_OR_FILE, default: str | None = None):
  """Defines `--config`: a preset name (`grpo`, `ppo:runlocal`; `presets.names()`) or a
  config file (`path/to/file.py[:arg]`), locked, so that a misspelt `--config.x.y=v`
  override is refused; `run` resolves the name and loads it with the flags."""
  return config_flags.DEFINE_config_file("config", default, help_text, lock_config=True)


def process_flags():
  """Defines the flags that join a run of several processes (`jax.distributed`) and returns
  the function that joins this process with their values (`distributed.initialize`), to
  call after flag parsing, before anything touches a device."""
  address = flags.DEFINE_string("coordinator_address", "",
                                "host:port of process 0 (several processes); or "
                                "$JAX_COORDINATOR_ADDRESS.")
  count = flags.DEFINE_integer("num_processes", None,
                               "Processes in the run; or $JAX_NUM_PROCESSES.")
  index = flags.DEFINE_integer("process_id", None, "This process's index; or $JAX_PROCESS_ID.")
  multihost = flags.DEFINE_bool("multihost", False,
                                "Join a multi-process run that JAX detects itself (Cloud TPU "
                                "pods, SLURM, Open MPI, Kubernetes).")

  def join() -> bool:
    from jaxrl_llm import distributed  # pylint: disable=g-import-not-at-top
    return distributed.initialize(address.value, count.value, index.value,
                                  auto_detect=multihost.value)
  return join


def usage_error(message: str, flags_help: bool = True):
  """Prints `message` (one line; a config file's traceback cut to its first and last
  lines) and exits with status 2."""
  if "Traceback (most recent call last)" in message:  # keep the config file's own error
    lines = [line for line in message.splitlines() if line.strip()]
    message = f"{lines[0]} {lines[-1]}"
  if flags_help:
    message += "\nPass --helpshort or --helpfull to see help on flags."
  print(message, file=sys.stderr)
  sys.exit(2)


def with_preset_paths(argv: list[str]) -> list[str]:
  """`--config=NAME[:arg]` -> the preset file's path (`jaxrl_llm.config.presets.path`)."""
  from jaxrl_llm.config import presets  # pylint: disable=g-import-not-at-top
  out = []
  for arg in argv:
    if arg.startswith("--config="):
      value = arg[len("--config="):]
      spec, sep, rest = value.partition(":")
      try:
        arg = f"--config={presets.path(spec)}{sep}{rest}"
      except ValueError as e:  # one line, as a bad config value's
        usage_error(f"--config={value}: {e}", flags_help=False)
    out.append(arg)
  return out


def parse_flags(argv: list[str], config) -> list[str]:
  """absl's flag parsing of `argv` with `config` (`config_flag`'s flag: loaded here, unless
  it has no value), with one clear line and exit status 2 for bad flags.

  Covers what absl's own parser reports (a bad value, a missing flag, an error raised by
  the config file's `get_config`, such as a bad argument after its colon), a misspelt
  `--config.x.y` override (ml_collections raises before any config exists) and a config
  file that cannot be loaded.
  """
  argv = with_preset_paths(argv)
  overrides = [a.lstrip("-").partition("=")[0] for a in argv[1:] if a.startswith("--config.")]
  twice = sorted({o for o in overrides if overrides.count(o) > 1})
  if twice:  # ml_collections would concatenate two tuple values silently
    usage_error(f"--{twice[0]} is given more than once: expected each override once")
  try:
    args = flags.FLAGS(argv)
    if config.value is not None:  # an optional --config (launch.serve's) may be left out
      config.value.keys()  # a config file that failed to load raises its error here
    return args
  except (flags.Error, OSError) as e:
    usage_error(str(e))
  except (AttributeError, KeyError) as e:
    from jaxrl_llm import config as config_lib  # pylint: disable=g-import-not-at-top
    for arg in argv[1:]:
      path = arg.lstrip("-").partition("=")[0]
      if path.startswith("config.") and (error := config_lib.unknown_key(path[len("config."):])):
        usage_error(f"{arg}: {error}")
    usage_error(f"a --config override: {e}")


def run(main: Callable[[], None], config, *, join: Callable[[], bool] | None = None,
        failed: Callable[[Exception], str] | None = None) -> None:
  """Runs a command: absl's `app.run` with `parse_flags` (`config` is `config_flag`'s flag),
  then `main()`. Asking for help is a success (exit 0: the command's docstring and flags on
  stdout); an argument that is not a flag is absl's usage error (exit 1); absl logs at
  WARNING (orbax logs every file it reads or writes at INFO); `join` (`process_flags`')
  joins the processes of a run before `main`. A `config.ConfigError` out of `main` (raised
  before anything loads) is a usage error: its one line, exit 2. Any other exception is
  `failed(error)`'s one line on stderr and exit status 1 (without `failed`: the traceback).
  """
  if HELP_FLAGS & set(sys.argv[1:]):
    print_help(main, full="--helpfull" in sys.argv)
    sys.exit(0)

  def main_after_flags(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from jaxrl_llm import config as config_lib  # pylint: disable=g-import-not-at-top
    logging.set_verbosity(logging.WARNING)
    if join is not None:
      join()
    try:
      main()
    except config_lib.ConfigError as e:
      usage_error("; ".join(str(e).splitlines()), flags_help=False)
    except Exception as e:  # noqa: BLE001 -- the command's own failure, in one line
      if failed is None:
        raise
      print(failed(e), file=sys.stderr)
      sys.exit(1)

  app.run(main_after_flags, flags_parser=lambda argv: parse_flags(argv, config))


def print_help(main: Callable[[], None], full: bool = False) -> None:
  """The docstring of `main`'s module and its flags (`full`: every flag, absl's and JAX's
  too) on stdout."""
  module = sys.modules[main.__module__]
  key = sys.argv[0] if main.__module__ == "__main__" else main.__module__  # absl's key
  doc = module.__doc__ or f"USAGE: {sys.argv[0]} [flags]\n"
  help_text = flags.FLAGS.get_help() if full else flags.FLAGS.module_help(key)
  print(f"{doc}\nflags:\n{help_text}" if help_text else doc)
