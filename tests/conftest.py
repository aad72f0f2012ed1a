"""Test set-up: 8 fake CPU devices so mesh and sharding tests run anywhere."""
import os

# Must happen before jax initialises its backends.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

from absl import flags  # noqa: E402

# absltest helpers (create_tempdir, ...) read absl flags; pytest never parses them.
flags.FLAGS.mark_as_parsed()
