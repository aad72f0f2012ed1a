"""Command lines (`python -m launch.train ...`) run as processes, without a fresh interpreter
each: what the tests of the command-line programs check (exit status, stdout, stderr) for
the cost of a fork instead of a start.

A server process imports the libraries the programs load (`PRELOAD`: JAX, transformers,
the trainer) once, then forks one child per run. The child takes the run's stdin
(/dev/null), stdout, stderr, working directory, environment and argv, and runs the module
as `python -m MODULE ARGS` does (`runpy._run_module_as_main`, which is what `-m` calls); it
ends as the interpreter ends (a SystemExit's status, an uncaught exception's traceback and
status 1; non-daemon threads joined, atexit functions run, output flushed), so its exit
status, stdout and stderr are the command's. It skips the interpreter's module-by-module
teardown, which shows nothing and takes seconds with JAX and transformers loaded.

What differs from a fresh `python -m`:
- The `PRELOAD` modules are imported already. What they print while importing is written
  at the head of every run's stdout and stderr, so a run shows at least what a fresh one
  would. None of them defines a flag of the programs (the programs' own modules,
  jaxrl_llm.cli and friends, are imported by each child).
- Environment variables read at import time have the server's values, so a server serves
  only runs with its own environment: one server per environment. XLA_FLAGS is left out
  of that: JAX reads it when it starts a backend, which the server never does (a run may
  set its own device count); so is PYTEST_CURRENT_TEST, which pytest sets per test.
tests/training/bad_input_test.py checks one run both ways, fresh and forked.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOAD = ("jax", "flax", "optax", "orbax.checkpoint", "transformers", "jaxrl_llm.config",
           "jaxrl_llm.training", "jaxrl_llm.training.checkpoint_eval", "jaxrl_llm.aot.chips")
# Not read at import: a run's own value applies (JAX reads XLA_FLAGS when it starts a
# backend; pytest sets PYTEST_CURRENT_TEST per test).
_NOT_READ_AT_IMPORT = ("XLA_FLAGS", "PYTEST_CURRENT_TEST")


def run(module: str, args, *, env=None, cwd: str = REPO, timeout: float = 600
        ) -> subprocess.CompletedProcess:
  """`python -m module *args` in `cwd` with `env` (default: this process's): its exit status,
  stdout and stderr, as `subprocess.run(..., capture_output=True, text=True)` gives them."""
  env = dict(os.environ if env is None else env)
  cmd = [sys.executable, "-m", module, *map(str, args)]
  with tempfile.TemporaryDirectory(prefix="cli_runs_") as tmp:
    out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    request = {"module": module, "args": cmd[3:], "cwd": os.path.abspath(cwd), "env": env,
               "stdout": out, "stderr": err}
    returncode = _server(env).run(request, timeout, cmd)
    with open(out, errors="replace") as f_out, open(err, errors="replace") as f_err:
      return subprocess.CompletedProcess(cmd, returncode, f_out.read(), f_err.read())


_SERVERS: dict[tuple, "_Server"] = {}


def _server(env: dict) -> "_Server":
  key = tuple(sorted((k, v) for k, v in env.items() if k not in _NOT_READ_AT_IMPORT))
  server = _SERVERS.get(key)
  if server is None or server.proc.poll() is not None:
    server = _SERVERS[key] = _Server(env)
  return server


class _Server:

  def __init__(self, env: dict):
    self.proc = subprocess.Popen(
        [sys.executable, "-c", "from tests import cli_runs; cli_runs.serve()"], cwd=REPO,
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        start_new_session=True)  # its own process group: a timeout kills it and its child

  def run(self, request: dict, timeout: float, cmd) -> int:
    self.proc.stdin.write(json.dumps(request) + "\n")
    self.proc.stdin.flush()
    ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
    if not ready:
      os.killpg(self.proc.pid, signal.SIGKILL)
      self.proc.wait()
      raise subprocess.TimeoutExpired(cmd, timeout)
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the command-line server died (status {self.proc.wait()})")
    return json.loads(line)["returncode"]

  def close(self):
    if self.proc.poll() is None:
      self.proc.stdin.close()  # the server ends its loop and exits (coverage saves its data)
      try:
        self.proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def close_all():
  """Ends every server (each exits normally)."""
  while _SERVERS:
    _SERVERS.popitem()[1].close()


atexit.register(close_all)  # a server lives as long as the process (files of a worker share it)


# --- the server ----------------------------------------------------------------------------
def serve():
  """Imports `PRELOAD`, then runs each request read from stdin (one JSON line) in a forked
  child and answers its exit status on stdout (one JSON line)."""
  import importlib  # pylint: disable=g-import-not-at-top
  answers = os.fdopen(os.dup(1), "w")
  stderr = os.dup(2)
  heads = []
  with tempfile.TemporaryFile() as head_out, tempfile.TemporaryFile() as head_err:
    os.dup2(head_out.fileno(), 1)
    os.dup2(head_err.fileno(), 2)
    for name in PRELOAD:
      importlib.import_module(name)
    sys.stdout.flush()
    sys.stderr.flush()
    for f in (head_out, head_err):
      f.seek(0)
      heads.append(f.read())
  os.dup2(stderr, 1)  # the server's own output, if any: the test's stderr
  os.dup2(stderr, 2)
  os.close(stderr)
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      answers.close()
      _child(request, heads)  # never returns: os._exit
    _, status = os.waitpid(pid, 0)
    answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
    answers.flush()
  _finalize(0)  # stdin closed: the tests are done (coverage saves in the atexit functions)


def _child(request: dict, heads: list[bytes]):
  """Becomes `python -m MODULE ARGS` (see the module's docstring) and exits."""
  import runpy  # pylint: disable=g-import-not-at-top
  try:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path, head in ((1, request["stdout"], heads[0]), (2, request["stderr"], heads[1])):
      f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
      os.write(f, head)
      os.dup2(f, fd)
      os.close(f)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = os.getcwd()  # as `-m` puts it (`-c`, which started the server: '')
    sys.argv = ["-m", *request["args"]]  # `-m` replaces argv[0] with the module's path
  except BaseException:  # noqa: BLE001 -- the harness's own failure: a status no run gives
    os._exit(99)
  try:
    runpy._run_module_as_main(request["module"])  # pylint: disable=protected-access
    code = 0
  except SystemExit as e:  # as the interpreter ends on one
    code = e.code
    if code is None:
      code = 0
    elif not isinstance(code, int):
      print(code, file=sys.stderr)
      code = 1
  except BaseException as e:  # noqa: BLE001 -- uncaught: the traceback on stderr, status 1
    sys.excepthook(*sys.exc_info())
    code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1  # it dies of SIGINT
  _finalize(code)


def _finalize(code: int):
  """The interpreter's end as far as it shows (Py_FinalizeEx: non-daemon threads joined,
  atexit functions run, stdout and stderr flushed), then the exit, without tearing down
  every module of JAX and transformers one by one (seconds, and nothing to see)."""
  import atexit as atexit_lib  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  threading._shutdown()  # pylint: disable=protected-access
  atexit_lib._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # noqa: BLE001,S110 -- a closed stream, as the interpreter ignores
      pass
  if code == -signal.SIGINT:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  os._exit(code & 0xFF)
