"""The TPU's KV layout (slot-major keys, a layer's new token kept beside its slice until the
stacked write; token-major pages read in place from the stacked pool) against the CPU's
(slot-minor keys written in place, slot-minor pages sliced per layer): the same attention,
the same samples token for token, and, compiled for a TPU, far fewer bytes per decode step.

The layout is a row of `sampling.DECODE_TUNING`; here the CPU's row is patched to the TPU's
layout, so both run on this host.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from jaxrl_llm import models, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import attention, kv_cache
from tests import hf_testing
from tests.sampling.turns_test import play

pytestmark = pytest.mark.slow_file(
    "both key layouts in every engine, loop and dtype, with turns and smaller pools: each "
    "pair of sampler programs compiled per layout; and four XLA:TPU compiles of the sampler")

EOS = hf_testing.TINY["eos_token_id"]
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def _on_cpu(layout: str):
  """`DECODE_TUNING` with the CPU's row using key layout `layout`."""
  row = dataclasses.replace(sampling.DECODE_TUNING["cpu"], key_layout=layout)
  return mock.patch.dict(sampling.DECODE_TUNING, cpu=row)


def _as_layout(cache: dict, layout: str) -> dict:
  """A slot-minor cache's buffers in `layout` (keys transposed for slot-major)."""
  if layout == "slot_minor":
    return cache
  return {"k_sd" if name == "k" else name: jnp.swapaxes(x, -1, -2) if name == "k" else x
          for name, x in cache.items()}


class CacheTest(parameterized.TestCase):
  """kv_cache's functions read and write either layout alike."""

  def setUp(self):
    super().setUp()
    rng = np.random.RandomState(0)
    self.cfg = models.ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=16,
                                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
    B, K, Dh, S = 3, 2, 8, 6
    self.cache = {"k": jnp.asarray(rng.randn(B, K, Dh, S), jnp.float32),
                  "v": jnp.asarray(rng.randn(B, K, S, Dh), jnp.float32)}
    self.k_new, self.v_new = (jnp.asarray(rng.randn(B, K, 1, Dh), jnp.float32) for _ in "kv")
    self.q_BTKGd = jnp.asarray(rng.randn(B, 1, K, 2, Dh), jnp.float32)
    self.valid_BS = jnp.asarray(rng.rand(B, S) < 0.8, jnp.int32).at[:, 4].set(1)

  def test_a_token_kept_beside_attends_as_if_it_were_written(self):
    written = kv_cache.write(self.cache, self.k_new, self.v_new, 4)  # slot-minor: in place
    want = attention.cache_attention(self.q_BTKGd, written, self.valid_BS, 4)
    major = _as_layout(self.cache, "slot_major")
    beside = kv_cache.write(major, self.k_new, self.v_new, 4)
    self.assertIn("new_k", beside)  # one layer's one token: not written
    np.testing.assert_array_equal(np.asarray(beside["k_sd"]), np.asarray(major["k_sd"]))
    got = attention.cache_attention(self.q_BTKGd, beside, self.valid_BS, 4)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    # ...and `commit` stores it where the slot-minor write put it.
    stored = kv_cache.commit(beside, 4)
    self.assertEqual(sorted(stored), ["k_sd", "v"])
    for name, x in _as_layout(written, "slot_major").items():
      np.testing.assert_array_equal(np.asarray(stored[name]), np.asarray(x))

  def test_stacked_and_multi_token_writes_are_stored(self):
    major = _as_layout(self.cache, "slot_major")
    stacked = jax.tree.map(lambda x: x[None], major)
    out = kv_cache.write(stacked, self.k_new[None], self.v_new[None], 2)
    self.assertNotIn("new_k", out)
    np.testing.assert_array_equal(np.asarray(out["k_sd"][0, :, :, 2:3]), np.asarray(self.k_new))
    two = jnp.concatenate([self.k_new, self.k_new + 1], axis=2)
    out = kv_cache.write(major, two, two, 1)
    self.assertNotIn("new_k", out)
    np.testing.assert_array_equal(np.asarray(out["k_sd"][:, :, 1:3]), np.asarray(two))

  def test_shapes_pages_prefix_and_padding(self):
    minor = kv_cache.shapes(self.cfg, 3, 6)
    major = kv_cache.shapes(self.cfg, 3, 6, "slot_major")
    self.assertEqual(minor, {"k": (2, 3, 2, 8, 6), "v": (2, 3, 2, 6, 8)})
    self.assertEqual(major, {"k_sd": (2, 3, 2, 6, 8), "v": (2, 3, 2, 6, 8)})
    with self.assertRaisesRegex(ValueError, "key_layout='rows'"):
      kv_cache.shapes(self.cfg, 3, 6, "rows")
    # Slot-major caches make token-major pages [NP, Q, K, Dh] of the same numbers.
    minor = kv_cache.as_pages(self.cache, 2)
    major = kv_cache.as_pages(_as_layout(self.cache, "slot_major"), 2)
    self.assertEqual(sorted(major), ["token_pages_k", "token_pages_v"])
    np.testing.assert_array_equal(np.asarray(major["token_pages_k"]),
                                  np.asarray(minor["pages_k"]).transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(np.asarray(major["token_pages_v"]),
                                  np.asarray(minor["pages_v"]).transpose(0, 2, 1, 3))
    self.assertEqual(kv_cache.page_shapes(self.cfg, 9, 2, "slot_major"),
                     {"token_pages_k": (2, 9, 2, 2, 8), "token_pages_v": (2, 9, 2, 2, 8)})
    # ...and a slot's new token lands on the same numbers in either.
    page, offset = jnp.asarray([3, 0, 5]), jnp.asarray([1, 0, 1])
    minor = kv_cache.write_pages(minor, self.k_new, self.v_new, page, offset)
    major = kv_cache.write_pages(major, self.k_new, self.v_new, page, offset)
    np.testing.assert_array_equal(np.asarray(major["token_pages_k"]),
                                  np.asarray(minor["pages_k"]).transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(np.asarray(major["token_pages_v"][5, 1]),
                                  np.asarray(self.v_new[2, :, 0]))
    prefixed = kv_cache.with_shared_prefix(_as_layout(self.cache, "slot_major"),
                                           _as_layout(self.cache, "slot_major"))
    self.assertEqual(sorted(prefixed), ["k_sd", "prefix_k_sd", "prefix_v", "v"])
    self.assertEqual(sorted(kv_cache.own_part(prefixed)), ["k_sd", "v"])
    for layout in ("slot_minor", "slot_major"):
      padded = kv_cache.pad_slots(_as_layout(self.cache, layout), 3)
      self.assertEqual(padded["v"].shape, (3, 2, 9, 8))
      self.assertEqual(padded[kv_cache.KEY_LAYOUTS[layout]].shape,
                       (3, 2, 8, 9) if layout == "slot_minor" else (3, 2, 9, 8))


class SamplesTest(parameterized.TestCase):
  """Both layouts sample the same completions, token for token, in every engine and loop."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf = hf_testing.make_hf_model("qwen3", vocab_size=128, hidden_size=64, intermediate_size=96)
    cls.path = hf_testing.save_hf_model(hf, tempfile.mkdtemp())
    rng = np.random.RandomState(9)
    cls.prompts = [list(rng.randint(3, 128, n)) for n in (6, 11, 2, 9)]
    cls.models, cls.runs = {}, {}

  def _model(self, dtype="float32"):
    if dtype not in self.models:
      self.models[dtype] = models.from_pretrained(self.path, dtype=dtype)
    return self.models[dtype]

  def _run(self, model, settings, layout):
    """(output, sampler) of `settings` sampling the prompts with key layout `layout`: each
    once for the class (its own sampler, called once)."""
    key = (id(model), settings, layout)
    if key not in self.runs:
      with _on_cpu(layout):
        sampler = sampling.Sampler(settings)
        self.runs[key] = model, sampler(model, self.prompts, 3), sampler
    return self.runs[key][1:]

  def _both(self, model, settings):
    """(slot-minor output, slot-major output, the slot-major sampler's kept cache)."""
    minor, _ = self._run(model, settings, "slot_minor")
    major, sampler = self._run(model, settings, "slot_major")
    return minor, major, sampler.cache

  # Every pair of (loop, engine, dtype) values in four runs, not all eight (suite time). The
  # continuous engine's settings are those of the smaller pool's test below (its whole pool).
  @parameterized.parameters(("scan", "continuous", "float32"),
                            ("unrolled", "continuous", "bfloat16"),
                            ("scan", "static", "bfloat16"), ("unrolled", "static", "float32"))
  def test_slot_major_keys_sample_the_same(self, layer_loop, engine, dtype):
    model = self._model(dtype)
    settings = sampling.SamplingSettings(2, 12, eos_ids=(EOS,), layer_loop=layer_loop,
                                         engine=engine, slots=4, page_size=4)
    minor, major, kept = self._both(model, settings)
    # The layout did change: the kept buffers are slot-major keys, or token-major pages.
    names = sorted(kept[0] if layer_loop == "unrolled" else kept)
    self.assertEqual(names, ["k_sd", "v"] if engine == "static" else
                     ["token_pages_k", "token_pages_v"])
    np.testing.assert_array_equal(np.asarray(major.tokens), np.asarray(minor.tokens))
    np.testing.assert_array_equal(np.asarray(major.lengths), np.asarray(minor.lengths))
    np.testing.assert_allclose(np.asarray(major.logprobs), np.asarray(minor.logprobs),
                               atol=1e-6)
    self.assertGreater(int(np.asarray(minor.lengths).min()), 1)  # several decode steps ran

  def test_a_smaller_pool_read_in_place(self):
    """The TPU's layout reads the stacked pool in place in the layer scan: a pool of one
    completion's worst case (3 pages of 4 tokens for 12) preempts, and samples the whole
    pool's completions."""
    model = self._model()
    settings = sampling.SamplingSettings(2, 12, eos_ids=(EOS,), layer_loop="scan",
                                         engine="continuous", slots=4, page_size=4)
    whole, _ = self._run(model, settings, "slot_major")
    small, sampler = self._run(model, dataclasses.replace(settings, kv_pages=3), "slot_major")
    self.assertGreater(int(sampler.stats["preemptions"]), 0)
    self.assertLessEqual(int(sampler.stats["peak_pages"]), 3)
    np.testing.assert_array_equal(np.asarray(small.tokens), np.asarray(whole.tokens))
    np.testing.assert_array_equal(np.asarray(small.lengths), np.asarray(whole.lengths))
    np.testing.assert_allclose(np.asarray(small.logprobs), np.asarray(whole.logprobs),
                               atol=1e-6)

  @pytest.mark.mesh
  def test_on_a_mesh(self):
    model = models.from_pretrained(self.path, mesh=sh.make_mesh(dict(data=2, fsdp=2, tensor=2)))
    settings = sampling.SamplingSettings(2, 12, eos_ids=(EOS,), layer_loop="scan",
                                         engine="static")
    minor, major, kept = self._both(model, settings)
    self.assertEqual(kept["k_sd"].sharding.spec, kept["v"].sharding.spec)
    np.testing.assert_array_equal(np.asarray(major.tokens), np.asarray(minor.tokens))
    np.testing.assert_allclose(np.asarray(major.logprobs), np.asarray(minor.logprobs),
                               atol=1e-6)

  @parameterized.parameters("scan", "unrolled")
  def test_turns_with_a_growing_cache(self, layer_loop):
    model = models.from_pretrained(self.path)
    prompts, replies = self.prompts[:3], [[[5, 6, 7], [8]], [[9], [10, 11]], [[12, 13], [3]]]
    budgets = [(6, 4, 5), (3, 8, 2), (5, 5, 5)]
    kw = dict(layer_loop=layer_loop, columns=(24, 160))  # grows after the first turn
    minor = play(model, prompts, replies, budgets, **kw)
    with _on_cpu("slot_major"):
      major = play(model, prompts, replies, budgets, **kw)
    self.assertEqual(major[0], minor[0])
    for b in range(3):
      np.testing.assert_allclose(major[2][b], minor[2][b], atol=1e-6)


@absltest.skipUnless(HAS_LIBTPU, "the TPU compiler (pip install -e '.[tpu]') is not installed")
class CompiledForTpuTest(absltest.TestCase):
  """What the TPU's layout is for, from XLA:TPU's program (compile only, v5e:2x2)."""

  def _bytes_per_call(self, engine: str, layout: str) -> float:
    from jaxrl_llm.aot import chips, hlo_cost  # pylint: disable=g-import-not-at-top
    mesh = sh.make_mesh(dict(data=1, fsdp=2, tensor=2), chips.topology_devices("v5e:2x2"))
    cfg = models.ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=512,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=128,
                             dtype="bfloat16")
    model = models.Model(models.abstract_params(cfg, mesh, sh.DEFAULT_RULES), cfg, mesh,
                         sh.DEFAULT_RULES)
    settings = sampling.SamplingSettings(4, 256, engine=engine)  # continuous: 16 slots
    row = dataclasses.replace(sampling.DECODE_TUNING["tpu"], key_layout=layout)
    with mock.patch.dict(sampling.DECODE_TUNING, tpu=row):
      text = sampling.Sampler(settings).lower_shapes(model, 8, 128).compile().as_text()
    return hlo_cost.program_cost(text, dynamic_trips=256).bytes_accessed

  @pytest.mark.slow("four XLA:TPU compiles of a 4-layer sampler on v5e:2x2 (static and "
                    "continuous, each layout); the persistent cache cannot serve them here")
  def test_the_tpu_layout_moves_far_fewer_bytes_per_decode_step(self):
    self.assertEqual(sampling.DECODE_TUNING["tpu"].key_layout, "slot_major")
    # Measured per call and chip (every loop at 256 trips), slot-minor -> slot-major: static
    # 12.1 -> 4.6 GB (the slice copies and tile-padded key columns gone), continuous 47.4 ->
    # 26.6 GB (the page slices copied into the read's switch, and the pool's relayout, gone).
    for engine, most in (("static", 0.5), ("continuous", 0.7)):
      before, after = (self._bytes_per_call(engine, layout) for layout in kv_cache.KEY_LAYOUTS)
      self.assertLess(after, most * before, engine)


if __name__ == "__main__":
  absltest.main()
