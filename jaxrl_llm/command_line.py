"""A command's `--config` flag: preset names, `--config.x.y=v` overrides, and one clear line
with exit status 2 for anything wrong with them (absl's own parsing, a misspelt override,
a config file that fails to load). Shared by `jaxrl-llm-train` (`jaxrl_llm.cli`),
`jaxrl-llm-evaluate` (`jaxrl_llm.eval_cli`) and `jaxrl-llm-compile` (`jaxrl_llm.aot.cli`);
the first two also join several processes (`process_flags`).
"""
from __future__ import annotations

import sys

from absl import app, flags


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


def parse_flags(argv: list[str], config_flag) -> list[str]:
  """absl's flag parsing of `argv` with `config_flag` (a `config_flags` config-file flag),
  with one clear line and exit status 2 for bad flags.

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
    config_flag.value.keys()  # a config file that failed to load raises its error here
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


def run(main, config_flag) -> None:
  """absl's `app.run(main)` with `parse_flags`; asking for help is a success (exit 0,
  the flags on stdout)."""
  if {"-h", "--help", "--helpshort", "--helpfull"} & set(sys.argv[1:]):
    app.usage(shorthelp="--helpfull" not in sys.argv, writeto_stdout=True, exitcode=0)
  app.run(main, flags_parser=lambda argv: parse_flags(argv, config_flag))
