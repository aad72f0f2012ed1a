"""Test set-up (docs/testing.md):

- CPU devices: 8 fake ones (`JAXRL_TEST_DEVICES`, default 8), so mesh and sharding tests
  run anywhere. `make test` runs the tests marked `mesh` (they need the 8-device mesh) with
  8, and all others with 1: a program over 8 devices on 2 cores compiles and runs slower.
- XLA's cheapest compiles (`JAX_DISABLE_MOST_OPTIMIZATIONS`: no LLVM optimisation; and,
  in this process, XLA:CPU's elemental emitters rather than its fusion emitters, which
  compile in about two thirds of the CPU time): the tests' tiny programs cost far more to
  compile than to run.
- One XLA compilation cache for the session (a fresh temporary folder, removed at exit): a
  run and its resume, or the same small config in several tests and in the subprocesses
  they start (which inherit the environment), compile each program once.
- The suite's time budget (tests/budget.py).
"""
import atexit
import os
import shutil
import tempfile

from tests import xla_flags

# Must happen before jax initialises its backends.
DEVICES = int(os.environ.setdefault("JAXRL_TEST_DEVICES", "8"))
os.environ.setdefault("XLA_FLAGS", f"--{xla_flags.DEVICE_COUNT}={DEVICES}")
# XLA reads XLA_FLAGS once, for every compile of the process: this process's own compiles
# take the cheapest code generation per compile (`_cheapest_cpu_codegen`, not the
# `optimized` tests'), so not from the flags that an xdist worker inherits from the
# controller, where this file added them for the subprocesses.
os.environ["XLA_FLAGS"] = xla_flags.without_cheapest_codegen(os.environ["XLA_FLAGS"])
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # pytest-xdist's workers inherit it
  _cache = tempfile.mkdtemp(prefix="jaxrl_llm_test_xla_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import jax  # noqa: E402
import pytest  # noqa: E402

pytest_plugins = ["tests.budget"]

jax.config.update("jax_numpy_rank_promotion", "raise")


def _cheapest_cpu_codegen():
  """While JAX_DISABLE_MOST_OPTIMIZATIONS holds (every test but those marked `optimized`),
  XLA:CPU compiles with `xla_flags.CHEAPEST_CPU_CODEGEN`, per-compile options (so the
  persistent cache keys on them, and `optimized` tests get XLA's defaults), and the
  subprocesses get them in XLA_FLAGS. Measured on 2 cores, CPU seconds: loop_test and
  turns_test 108.7 -> 72.7 (elemental emitters); loop_test 53.9 -> 46.6 (one LLVM module).
  jax calls one private function for every compile's options; should a jax release change
  it, or XLA refuse an option, the tests compile as jax says (slower, nothing else)."""
  import inspect  # pylint: disable=g-import-not-at-top
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  original = getattr(compiler, "get_compile_options", None)
  if (original is None or not hasattr(compiler, "_DISABLE_MOST_OPTIMIZATIONS") or
      not {"env_options_overrides", "backend"} <= set(inspect.signature(original).parameters)):
    return
  try:  # an XLA without the option refuses it
    jax.jit(lambda x: x + 1).lower(1.0).compile(xla_flags.CHEAPEST_CPU_CODEGEN)
  except Exception:  # noqa: BLE001 -- then the tests compile as jax says
    return

  def get_compile_options(*args, env_options_overrides=None, backend=None, **kwargs):
    if (compiler._DISABLE_MOST_OPTIMIZATIONS.value  # pylint: disable=protected-access
        and getattr(backend, "platform", None) == "cpu"):
      env_options_overrides = {**xla_flags.CHEAPEST_CPU_CODEGEN,
                               **(env_options_overrides or {})}
    return original(*args, env_options_overrides=env_options_overrides, backend=backend,
                    **kwargs)

  compiler.get_compile_options = get_compile_options
  if compiler._DISABLE_MOST_OPTIMIZATIONS.value:  # pylint: disable=protected-access
    # The subprocesses (they inherit the environment; tests/xla_flags.py): the same, as a flag.
    os.environ["XLA_FLAGS"] += " " + xla_flags.as_flags(xla_flags.CHEAPEST_CPU_CODEGEN)


_cheapest_cpu_codegen()

from absl import flags  # noqa: E402

# absltest helpers (create_tempdir, ...) read absl flags; pytest never parses them.
flags.FLAGS.mark_as_parsed()


def pytest_configure(config):
  config.addinivalue_line("markers", "mesh: needs the 8-device CPU mesh (make test runs it "
                          "with JAXRL_TEST_DEVICES=8, all other tests with 1)")
  config.addinivalue_line("markers", "optimized: compiles with XLA's optimisations (a test "
                          "whose programs run long enough to pay for them)")


@pytest.fixture(autouse=True)
def _xla_optimizations(request):
  """`@pytest.mark.optimized`: this test's programs compile with XLA's optimisations (its
  subprocesses: pass JAX_DISABLE_MOST_OPTIMIZATIONS=0 in their environment). JAX's
  in-memory caches do not key on the setting: they are cleared before and after, so that
  no program compiled the other way is reused (a test's numbers depend on it)."""
  if request.node.get_closest_marker("optimized") is None:
    yield
    return
  before = jax.config.read("jax_disable_most_optimizations")
  jax.clear_caches()
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", before)
    jax.clear_caches()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects them
def pytest_collection_modifyitems(items):
  """`make test`'s mesh session collects only the files that say `pytest.mark.mesh`
  (Makefile: MESH_FILES): a test marked `mesh` otherwise would run in neither session."""
  marked = {}  # file -> whether it says so (read once per file)
  for item in items:
    if not item.get_closest_marker("mesh"):
      continue
    if item.path not in marked:
      marked[item.path] = "pytest.mark.mesh" in item.path.read_text()
    if not marked[item.path]:
      raise pytest.UsageError(f"{item.nodeid} is marked mesh, but its file does not say "
                              "`pytest.mark.mesh`, which `make test` selects the mesh "
                              "session's files by: mark it so")


def pytest_runtest_setup(item):
  if item.get_closest_marker("mesh") and jax.device_count() < 8:
    pytest.skip(f"needs the 8-device mesh; this session has {jax.device_count()} "
                "(JAXRL_TEST_DEVICES=8)")
