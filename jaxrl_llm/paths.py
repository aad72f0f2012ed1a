"""Local paths and gs:// URLs behind one set of file operations.

Every file the trainer reads or writes outside orbax goes through here: config.json,
metrics.jsonl, the HF export, `model.path` and tokenizer directories, JSONL data, plots.
Paths stay strings. A local path is handled as before, with the standard library; a
gs:// URL goes through `etils.epath` (what orbax uses for its own files) on its fsspec
backend, gcsfs (`pip install 'jaxrl_llm[gcs]'`). epath would switch to tf.io.gfile
whenever tensorflow happens to be installed; EPATH_USE_TF=false, set on the first gs://
path handled here unless the environment sets it (epath decides its backend once, at
its first gs:// path: a run's first is the workdir check's or the model's, both
here), keeps the backend the same on every machine. orbax writes its
arrays through tensorstore's own GCS driver; TensorBoard events go through
tensorboardX's (google-cloud-storage).

What a kill leaves behind:
  local  `write_atomic` and `replace` write a temporary file beside the target and
         rename it: the old file or the new one, never half of one. `append` adds
         one flushed write to the end.
  gs://  an object appears whole when its upload finishes, or not at all, so
         `write_atomic` and `replace` are single uploads. Objects cannot be appended
         to: `append` uploads the new text as an object of its own and composes it
         onto the end of the old one (one atomic compose, so the object is the old
         text or the old text plus the new). A directory of several objects is never
         replaced atomically as a whole.

Credentials and endpoints are the clients' own: application default credentials on
Cloud TPU / GCE, STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage) and
TENSORSTORE_GCS_HTTP_URL (orbax's arrays) for an emulator.
"""
from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import posixpath
import shutil
import tempfile
from typing import IO, Iterator

REMOTE_PREFIX = "gs://"
_MANIFEST = ".jaxrl_llm_source.json"


def is_remote(path: str) -> bool:
  """True for a gs:// URL; raises for another URL scheme."""
  path = os.fspath(path)
  if path.startswith(REMOTE_PREFIX):
    return True
  if "://" in path:
    raise ValueError(f"{path!r}: unsupported URL scheme; expected a local path or a "
                     f"{REMOTE_PREFIX}bucket/... URL")
  return False


def _epath(path: str):
  """The epath.Path of a gs:// URL, once gcsfs is known to be importable."""
  try:
    import gcsfs  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ImportError(f"{path!r}: gs:// paths need gcsfs; install it with "
                      "`pip install 'jaxrl_llm[gcs]'`") from e
  os.environ.setdefault("EPATH_USE_TF", "false")  # see the module docstring
  from etils import epath  # pylint: disable=g-import-not-at-top
  return epath.Path(path)


def _gcs():
  """The gcsfs filesystem epath uses for gs:// (the same cached instance)."""
  import fsspec  # pylint: disable=g-import-not-at-top
  return fsspec.filesystem("gcs", finalize_on_close=True)


def join(path: str, *names: str) -> str:
  return posixpath.join(path, *names) if is_remote(path) else os.path.join(path, *names)


def absolute(path: str) -> str:
  """A local path made absolute; a URL unchanged."""
  return path if is_remote(path) else os.path.abspath(path)


def exists(path: str) -> bool:
  return _epath(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _epath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return _epath(path).is_file() if is_remote(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
  """The names in a directory (for gs://, the objects and prefixes one level down)."""
  if is_remote(path):
    return [p.name for p in _epath(path).iterdir()]
  return os.listdir(path)


def makedirs(path: str) -> None:
  """Creates a local directory and its parents; gs:// has no directories (a no-op)."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
  if is_remote(path):
    _epath(path).unlink()
  else:
    os.remove(path)


def open(path: str, mode: str = "r") -> IO:  # pylint: disable=redefined-builtin
  """A file object: text modes read and write UTF-8. On gs://, 'w' uploads on close."""
  if "a" in mode:
    raise ValueError(f"mode={mode!r}: gs:// objects cannot be appended to; use append()")
  if not is_remote(path):
    return builtins.open(path, mode, encoding=None if "b" in mode else "utf-8")
  f = _epath(path).open(mode if "b" in mode else mode + "b")
  # epath's text mode would decode with the locale's encoding.
  return f if "b" in mode else io.TextIOWrapper(f, encoding="utf-8")


def read_text(path: str) -> str:
  with open(path) as f:
    return f.read()


def write_atomic(path: str, data: str | bytes) -> None:
  """Writes the whole file: a kill leaves the old content or the new (module docstring)."""
  tmp = temp_file_for(path)
  with builtins.open(tmp, "wb" if isinstance(data, bytes) else "w",
                     encoding=None if isinstance(data, bytes) else "utf-8") as f:
    f.write(data)
  replace(tmp, path)


def temp_file_for(path: str) -> str:
  """A local file name to write before `replace(tmp, path)`: beside `path` when local
  (so the rename stays on one filesystem), in the system temporary directory for gs://."""
  if is_remote(path):
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", suffix="." + posixpath.basename(path))
    os.close(fd)
    return tmp
  return os.path.join(os.path.dirname(path), f".tmp.{os.path.basename(path)}")


def replace(tmp: str, path: str) -> None:
  """Moves the finished local file `tmp` (from `temp_file_for`) to `path` in one step."""
  if not is_remote(path):
    os.replace(tmp, path)
    return
  try:
    with builtins.open(tmp, "rb") as src, open(path, "wb") as dst:
      shutil.copyfileobj(src, dst, 1 << 22)
  finally:
    os.remove(tmp)


def append(path: str, text: str) -> None:
  """Adds `text` to the end of `path` (created if missing); see the module docstring."""
  if not is_remote(path):
    with builtins.open(path, "a", encoding="utf-8") as f:
      f.write(text)
    return
  if not exists(path):
    write_atomic(path, text)
    return
  part = path + ".append"  # one writer per file, so one fixed name; overwritten if stale
  write_atomic(part, text)
  fs = _gcs()
  fs.merge(path, [path, part])  # GCS compose: atomic, and the result is durable
  fs.rm(part)


@contextlib.contextmanager
def local_staging(path: str) -> Iterator[str]:
  """A local directory whose files end up in the directory `path`.

  For a local `path`, `path` itself. For gs://, a temporary directory whose files are
  uploaded into `path` (one object each) when the block exits without an error: for
  writers that only take a local directory, such as a tokenizer's `save_pretrained`.
  """
  if not is_remote(path):
    makedirs(path)
    yield path
    return
  with tempfile.TemporaryDirectory(prefix="jaxrl_llm_stage_") as local:
    yield local
    for name in sorted(os.listdir(local)):
      if os.path.isfile(os.path.join(local, name)):
        with builtins.open(os.path.join(local, name), "rb") as src, \
            open(join(path, name), "wb") as dst:
          shutil.copyfileobj(src, dst, 1 << 22)


def cache_dir() -> str:
  """Where `local_copy` keeps copies: $JAXRL_LLM_CACHE, default ~/.cache/jaxrl_llm."""
  return os.environ.get("JAXRL_LLM_CACHE",
                        os.path.join(os.path.expanduser("~"), ".cache", "jaxrl_llm"))


def _listing(path: str) -> dict[str, list]:
  """{name: [size, mtime]} of the files directly in a gs:// directory."""
  listing = {}
  for p in _epath(path).iterdir():
    if p.is_file():
      st = p.stat()
      listing[p.name] = [st.length, st.mtime]
  return listing


def local_copy(path: str) -> str:
  """`path` itself when local; for a gs:// directory, a local copy of its files.

  For readers that need a local directory (transformers' tokenizers, memory-mapped
  safetensors). The copy lives in `cache_dir()` and is reused while the directory's
  listing (names, sizes, modification times) is unchanged; otherwise it is fetched
  again. Only files directly in the directory are copied, not subdirectories (such as
  the `original/` folder of some Hub checkpoints). A copy is fetched into a temporary
  directory and renamed into place, so a killed fetch is never used.
  """
  if not is_remote(path):
    return path
  if not isdir(path):
    raise FileNotFoundError(f"{path!r} does not exist or is not a directory")
  listing = _listing(path)
  if not listing:
    raise FileNotFoundError(f"{path!r} holds no files, only subdirectories")
  target = os.path.join(cache_dir(), "gs", path[len(REMOTE_PREFIX):].strip("/"))
  manifest = os.path.join(target, _MANIFEST)
  if _read_json(manifest) == {"source": path, "files": listing}:
    return target
  os.makedirs(os.path.dirname(target), exist_ok=True)
  fetch = tempfile.mkdtemp(prefix=os.path.basename(target) + ".fetch.",
                           dir=os.path.dirname(target))
  try:
    for name in listing:
      with open(join(path, name), "rb") as src, \
          builtins.open(os.path.join(fetch, name), "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 22)
    with builtins.open(os.path.join(fetch, _MANIFEST), "w", encoding="utf-8") as f:
      json.dump({"source": path, "files": listing}, f)
    if _read_json(manifest) == {"source": path, "files": listing}:
      return target  # another process on this machine finished the same copy meanwhile
    stale = None
    if os.path.exists(target):  # an older copy: set aside, then deleted
      stale = tempfile.mkdtemp(prefix=os.path.basename(target) + ".stale.",
                               dir=os.path.dirname(target))
      os.replace(target, os.path.join(stale, "old"))
    try:
      os.rename(fetch, target)
    except OSError:  # another process put its copy there first; keep theirs if complete
      if _read_json(manifest) != {"source": path, "files": listing}:
        raise
    if stale:
      shutil.rmtree(stale, ignore_errors=True)
  finally:
    shutil.rmtree(fetch, ignore_errors=True)
  return target


def _read_json(path: str):
  try:
    with builtins.open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None
