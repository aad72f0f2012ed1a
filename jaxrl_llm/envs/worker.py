"""Running one tool call with a time limit: in a worker process, or in a thread.

`ProcessRunner` (used for an environment built by `load_environment`, which knows its
spec) keeps one persistent worker process per environment instance, started lazily
with the 'spawn' method. The worker builds the environment again from the same spec
and env_args (`load_environment`), then answers calls `(tool name, JSON arguments)` with
`('ok', text)` or `('raised', text)` over a pipe: nothing is pickled but the spec, the
arguments and the strings. A call that runs past its limit gets the worker killed
(SIGKILL: the tool is really stopped, a hung C extension included; processes the tool
itself started are not); the next call starts a fresh worker. Start-up is not counted in
a call's limit.

Cost (measured on a 2-core CPU machine): a call is a pipe round trip, about 0.1 ms plus
the tool's own time; a worker start, paid at the first call and after each timeout, is
a fresh interpreter importing this package and the environment's module, about 0.1 s.
'spawn' also imports the parent's `__main__` module in the worker (as `__mp_main__`; its
`if __name__ == "__main__":` block does not run, so a main script must have one): under
`python -m pytest` that is nothing, under a main script that imports jax at the top it
makes a start about 1.3 s.

Because of this, tools must be functions of their arguments: a tool runs in another
process, on another instance of the environment, and may be killed at any point. State
that lives across turns belongs in the environment's `step`.

`ThreadRunner` (an environment built directly, without a spec, as in tests) calls the
tool in-process on a daemon thread and waits at most the limit: it reports the timeout,
but a Python thread cannot be stopped, so a hung tool keeps running in the background.
"""
import json
import multiprocessing
import threading
import weakref
from typing import Any, Callable

from jaxrl_llm.envs import base

OK, RAISED, TIMEOUT = "ok", "raised", "timeout"


def format_result(result: Any) -> str:
  """A tool's return value as the tool message's text: a str as is, else JSON, else str()."""
  if isinstance(result, str):
    return result
  try:
    return json.dumps(result)
  except (TypeError, ValueError):
    return str(result)


def error_text(e: BaseException) -> str:
  return f"error: {type(e).__name__}: {e}"


def _run(fn: Callable[..., Any], arguments: dict) -> tuple[str, str]:
  try:
    return OK, format_result(fn(**arguments))
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except
    return RAISED, error_text(e)


class ThreadRunner:
  """Calls tools in this process; a timeout is reported, the thread is left running."""

  def __init__(self, functions: Callable[[], dict[str, Callable[..., Any]]]):
    self.functions = functions  # -> the tools by name, read at each call

  def call(self, name: str, arguments: dict, timeout_s: float | None) -> tuple[str, str]:
    fn, reply = self.functions()[name], []
    thread = threading.Thread(target=lambda: reply.append(_run(fn, arguments)),
                              name=f"jaxrl_llm tool {name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return reply[0] if reply else (TIMEOUT, "")

  def close(self) -> None:
    pass


def _worker_main(conn, spec: str, env_args: dict) -> None:
  """The worker process: build the environment, then answer calls until the pipe closes."""
  try:
    env = base.load_environment(spec, env_args)
    functions = env.tool_functions()
  except BaseException as e:  # pylint: disable=broad-except
    conn.send(("init_error", f"{type(e).__name__}: {e}"))
    return
  conn.send(("ready", ""))
  while True:
    try:
      name, arguments = conn.recv()
    except (EOFError, OSError):  # the parent closed the pipe or exited
      return
    conn.send(_run(functions[name], arguments))


def _stop(state: dict) -> None:
  """Kills the worker in `state` (if any) and closes its pipe; safe to call twice."""
  proc, conn = state.pop("proc", None), state.pop("conn", None)
  if conn is not None:
    conn.close()
  if proc is not None:
    if proc.is_alive():
      proc.kill()
    proc.join(5)


class ProcessRunner:
  """Calls tools in a persistent 'spawn' worker process, killed and replaced on a timeout.

  Thread-safe (calls are serialised). `close()` stops the worker; so do garbage
  collection and interpreter exit.
  """

  def __init__(self, spec: str, env_args: dict, *, startup_timeout_s: float = 120.0):
    self.spec, self.env_args = spec, dict(env_args)
    self.startup_timeout_s = startup_timeout_s
    self.starts = 0  # worker processes started so far (1 + the restarts)
    self._state: dict = {}
    self._lock = threading.Lock()
    self._finalizer = weakref.finalize(self, _stop, self._state)

  @property
  def pid(self) -> int | None:
    proc = self._state.get("proc")
    return proc.pid if proc is not None else None

  def _start(self) -> None:
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_worker_main, args=(child_conn, self.spec, self.env_args),
                       name=f"jaxrl_llm tools {self.spec}", daemon=True)
    proc.start()
    child_conn.close()
    self._state.update(proc=proc, conn=conn)
    self.starts += 1
    where = f"Tool worker of environment {self.spec!r}"
    if not conn.poll(self.startup_timeout_s):
      _stop(self._state)
      raise base.EnvError(f"{where} did not start within {self.startup_timeout_s:g} s.")
    try:
      status, text = conn.recv()
    except (EOFError, OSError) as e:
      _stop(self._state)
      raise base.EnvError(f"{where} exited while starting (exit code {proc.exitcode}).") from e
    if status != "ready":
      _stop(self._state)
      raise base.EnvError(f"{where} cannot build the environment (env_args "
                          f"{self.env_args!r}): {text}")

  def call(self, name: str, arguments: dict, timeout_s: float | None) -> tuple[str, str]:
    with self._lock:
      if "proc" not in self._state or not self._state["proc"].is_alive():
        _stop(self._state)
        self._start()
      proc, conn = self._state["proc"], self._state["conn"]
      try:
        conn.send((name, arguments))
        if not conn.poll(timeout_s):
          _stop(self._state)
          return TIMEOUT, ""
        return conn.recv()
      except (EOFError, OSError):  # the tool ended the process (os._exit, a crash, OOM)
        _stop(self._state)
        return RAISED, f"error: the tool process died while running {name!r} " \
                       f"(exit code {proc.exitcode})"

  def close(self) -> None:
    with self._lock:
      _stop(self._state)
