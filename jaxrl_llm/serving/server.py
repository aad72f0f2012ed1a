"""The endpoint as a running server: uvicorn on its own thread (`Server`), for the trainer's
agent programs and for tests; `launch.serve` runs the same app in the foreground."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from jaxrl_llm.serving.api import make_app
from jaxrl_llm.serving.backend import Backend

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_binding(host: str, api_key: str | None) -> None:
  """Raises ValueError unless `host` is loopback or an API key guards the server."""
  if host not in LOOPBACK and not api_key:
    raise ValueError(f"--host={host!r} exposes the model beyond this machine: expected "
                     "--api_key (requests must then carry it) or --host=127.0.0.1")


def bind(host: str, port: int) -> socket.socket:
  """A listening socket on (host, port); port 0 takes a free one."""
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  sock.bind((host, port))
  sock.listen(2048)
  return sock


class Server:
  """Serves `backend` on (host, port) from a background thread until `close()`.

  `base_url` is the OpenAI base URL (`http://HOST:PORT/v1`); `episode_url(ID)` an
  episode-scoped one (`backend`)."""

  def __init__(self, backend: Backend, host: str = "127.0.0.1", port: int = 0,
               api_key: str | None = None):
    check_binding(host, api_key)
    self.backend = backend
    self._socket = bind(host, port)
    self.host, self.port = host, self._socket.getsockname()[1]
    config = uvicorn.Config(make_app(backend, api_key), log_level="warning", lifespan="off",
                            timeout_keep_alive=30)
    self._server = uvicorn.Server(config)
    self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                    name="serving-http", daemon=True)
    self._thread.start()
    deadline = time.monotonic() + 30
    while not self._server.started:
      if not self._thread.is_alive() or time.monotonic() > deadline:
        raise RuntimeError(f"the endpoint did not start on {host}:{self.port}")
      time.sleep(0.01)

  @property
  def root(self) -> str:
    return f"http://{self.host}:{self.port}"

  @property
  def base_url(self) -> str:
    return f"{self.root}/v1"

  def episode_url(self, episode: str) -> str:
    return f"{self.root}/episodes/{episode}/v1"

  @property
  def running(self) -> bool:
    return self._thread.is_alive()

  def close(self) -> None:
    self._server.should_exit = True
    self._thread.join(timeout=30)
    self._socket.close()
