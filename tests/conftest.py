"""Test set-up: 8 fake CPU devices so mesh and sharding tests run anywhere, and one XLA
compilation cache for the session (a fresh temporary folder, removed at exit): a run and
its resume, or the same small config in several tests and in the subprocesses they start
(which inherit the environment), compile each program once."""
import atexit
import os
import shutil
import tempfile

# Must happen before jax initialises its backends.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # pytest-xdist's workers inherit it
  _cache = tempfile.mkdtemp(prefix="jaxrl_llm_test_xla_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

from absl import flags  # noqa: E402

# absltest helpers (create_tempdir, ...) read absl flags; pytest never parses them.
flags.FLAGS.mark_as_parsed()
