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

`run` waits for the command's end; `start` returns at once with a handle that behaves as a
`subprocess.Popen` does (`pid`, `poll`, `wait`, `send_signal`, `kill`), for the tests that
signal a run or watch it as it goes. A server runs one command at a time.
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
  with tempfile.TemporaryDirectory(prefix="cli_runs_") as tmp:
    out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    started = start(module, args, stdout=out, stderr=err, env=env, cwd=cwd)
    try:
      returncode = started.wait(timeout)
    except subprocess.TimeoutExpired:
      started.server.kill()
      raise
    with open(out, errors="replace") as f_out, open(err, errors="replace") as f_err:
      return subprocess.CompletedProcess(started.args, returncode, f_out.read(), f_err.read())


def start(module: str, args, *, stdout: str, stderr: str | None = None, append: bool = False,
          env=None, cwd: str = REPO) -> "Started":
  """Starts `python -m module *args` in `cwd` with `env` (default: this process's), its
  output written to the file `stdout` (`append`: after what it holds), its errors to
  `stderr` (None: to `stdout` as well, as `stderr=subprocess.STDOUT` does)."""
  env = dict(os.environ if env is None else env)
  cmd = [sys.executable, "-m", module, *map(str, args)]
  request = {"module": module, "args": cmd[3:], "cwd": os.path.abspath(cwd), "env": env,
             "stdout": os.path.abspath(stdout),
             "stderr": os.path.abspath(stderr or stdout), "append": append}
  server = _server(env)
  return Started(server, server.start(request, cmd), cmd)


class Started:
  """A command `start`ed, as a `subprocess.Popen` of it: its pid and, once it has ended,
  its exit status (negative: the signal that ended it)."""

  def __init__(self, server: "_Server", pid: int, args):
    self.server, self.pid, self.args, self.returncode = server, pid, args, None

  def poll(self) -> int | None:
    try:
      return self.wait(0)
    except subprocess.TimeoutExpired:
      return None

  def wait(self, timeout: float | None = None) -> int:
    if self.returncode is None:
      if not self.server.ended(timeout):
        raise subprocess.TimeoutExpired(self.args, timeout)
      self.returncode = self.server.returncode()
    return self.returncode

  def send_signal(self, sig: int):
    if self.poll() is None:  # not yet reaped by the server: the pid is still this run's
      os.kill(self.pid, sig)

  def kill(self):
    self.send_signal(signal.SIGKILL)


_SERVERS: dict[tuple, list["_Server"]] = {}


def _server(env: dict) -> "_Server":
  """An idle server of `env`: one of those started for it, else a new one."""
  key = tuple(sorted((k, v) for k, v in env.items() if k not in _NOT_READ_AT_IMPORT))
  servers = _SERVERS.setdefault(key, [])
  servers[:] = [s for s in servers if s.proc.poll() is None]
  for server in servers:
    if server.idle():
      return server
  servers.append(_Server(env))
  return servers[-1]


class _Server:
  """A server process (`serve`) and its answers: a pid when it has forked a command, that
  command's exit status when it has ended."""

  def __init__(self, env: dict):
    self.proc = subprocess.Popen(
        [sys.executable, "-c", "from tests import cli_runs; cli_runs.serve()"], cwd=REPO,
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        start_new_session=True)  # its own process group: a timeout kills it and its child
    self.running = False  # a command started whose exit status is not yet read
    self._answers = b""  # read from its stdout, unbuffered: select() sees what is left

  def idle(self) -> bool:
    """No command running (one that a test left and that has ended since: its status read)."""
    if self.running and self.ended(0):
      self.returncode()
    return not self.running

  def start(self, request: dict, cmd) -> int:
    """Sends the request; the child's pid once the server has forked it."""
    self.proc.stdin.write((json.dumps(request) + "\n").encode())
    self.proc.stdin.flush()
    self.running = True
    return self._answer()["pid"]

  def ended(self, timeout: float | None) -> bool:
    return (b"\n" in self._answers
            or bool(select.select([self.proc.stdout], [], [], timeout)[0]))

  def returncode(self) -> int:
    self.running = False
    return self._answer()["returncode"]

  def _answer(self) -> dict:
    while b"\n" not in self._answers:
      chunk = os.read(self.proc.stdout.fileno(), 4096)
      if not chunk:
        raise RuntimeError(f"the command-line server died (status {self.proc.wait()})")
      self._answers += chunk
    line, self._answers = self._answers.split(b"\n", 1)
    return json.loads(line)

  def kill(self):
    """The server and the command it runs (a run past its timeout)."""
    os.killpg(self.proc.pid, signal.SIGKILL)
    self.proc.wait()

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
    for server in _SERVERS.popitem()[1]:
      server.close()


atexit.register(close_all)  # a server lives as long as the process (files of a worker share it)


# --- the server ----------------------------------------------------------------------------
def serve():
  """Imports `PRELOAD`, then runs each request read from stdin (one JSON line) in a forked
  child and answers on stdout (a JSON line each) the child's pid, then its exit status."""
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
    answers.write(json.dumps({"pid": pid}) + "\n")
    answers.flush()
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
    mode = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if request["append"] else os.O_TRUNC)
    out = os.open(request["stdout"], mode, 0o600)
    err = out if request["stderr"] == request["stdout"] else os.open(request["stderr"], mode,
                                                                      0o600)
    for fd, f, head in ((1, out, heads[0]), (2, err, heads[1])):
      os.write(f, head)
      os.dup2(f, fd)
    for f in {out, err}:
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
