"""The continuous engine against the static one: same requests and keys, same completions."""
import functools
import tempfile

import jax
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from jaxrl_llm import models, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import kv_cache
from jaxrl_llm.sampling import continuous
from tests import hf_testing

pytestmark = pytest.mark.slow_file(
    "the continuous engine against the static one in each layer loop, on meshes, with smaller "
    "pools that preempt: every engine setting is its own compiled program (about 10 s each on "
    "2 cores; 15 on one device), each run once per file and shared by the tests that check it")

V = hf_testing.TINY["vocab_size"]
EOS_IDS = (3, 4, 5, 6)  # several stop ids: completions end at many different lengths


@functools.cache  # one model per architecture for the module's tests (none changes it)
def _model(arch="qwen2"):
  hf = hf_testing.make_hf_model(arch)
  return models.from_pretrained(hf_testing.save_hf_model(hf, tempfile.mkdtemp()))


def _prompts(seed, lengths):
  rng = np.random.RandomState(seed)
  return [[int(t) for t in rng.randint(7, V, n)] for n in lengths]


def assert_same(want, got):
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.mask, want.mask)
  np.testing.assert_array_equal(got.lengths, want.lengths)
  np.testing.assert_array_equal(got.truncated, want.truncated)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


_SAMPLED = {}


def _sample(model, prompts, engine, seed=3, budgets=None, **kw):
  """(the sampler, its output) of one call with these settings. Calls with the same model,
  prompts, seed, budgets and settings are made once for the module: the sampler of each is
  its own and called once, so its stats and kept cache are that call's. (Each engine setting
  is its own compiled program, about 10 s on 2 cores: the tests share settings where the
  setting is not what they check. Calls of one setting with other prompts of the same
  shapes, another seed or budgets compile nothing new: the session's compilation cache.)"""
  settings = dict(num_samples=3, max_new_tokens=24, temperature=1.0, eos_ids=EOS_IDS)
  settings.update(kw)
  settings = sampling.SamplingSettings(engine=engine, **settings)
  budgets = None if budgets is None else tuple(int(b) for b in budgets)
  key = (id(model), tuple(map(tuple, prompts)), seed, budgets, settings)
  if key not in _SAMPLED:
    sampler = sampling.Sampler(settings)
    _SAMPLED[key] = model, sampler, jax.device_get(sampler(model, prompts, seed,
                                                           budgets=budgets))
  return _SAMPLED[key][1:]


# The settings several tests share (each one compiled program, run once): the 2-slot engine
# of SameAsStaticTest's first case (also the whole pool of SmallerPoolTest's third); the
# 1-slot engine of its third; SmallerPoolTest's first and second cases' whole pools.
TWO_SLOTS = dict(slots=2, page_size=4, layer_loop="unrolled", top_k=40, top_p=0.95)
ONE_SLOT = dict(slots=1, page_size=16, layer_loop="unrolled", top_k=40, top_p=0.95)
NO_EOS = dict(slots=8, page_size=4, layer_loop="unrolled", top_k=40, top_p=0.95, eos_ids=())
SCAN = dict(slots=8, page_size=4, layer_loop="scan", top_k=40, top_p=0.95)
PROMPTS = _prompts(0, (5, 11, 3, 9, 14))  # 15 requests, 24 new tokens at most


class SameAsStaticTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = _model()
    cls.prompts = PROMPTS  # 15 requests

  @parameterized.parameters(("unrolled", 2, 4), ("scan", 15, 32), ("unrolled", 1, 16))
  def test_each_request_gets_the_static_engines_completion(self, layer_loop, slots, page):
    """Float32, top-k and top-p on: with fewer slots than requests, most requests start in a
    slot another request freed, next to neighbours the static batch never gave them."""
    kw = dict(layer_loop=layer_loop, top_k=40, top_p=0.95)
    _, want = _sample(self.model, self.prompts, "static", **kw)
    sampler, got = _sample(self.model, self.prompts, "continuous", slots=slots, page_size=page,
                           **kw)
    self.assertGreater(len(set(want.lengths.tolist())), 4)  # lengths really differ
    self.assertGreater(want.truncated.sum(), 0)
    self.assertLess(want.truncated.sum(), len(want.lengths))
    assert_same(want, got)
    # A request's first token comes from its prompt's logits, each later one from a decode
    # step: M slots need at least (tokens - requests) / M steps.
    made = int(want.lengths.sum()) - len(want.lengths)
    self.assertGreaterEqual(int(sampler.stats["steps"]), -(-made // slots))
    if slots == 1:
      self.assertEqual(int(sampler.stats["steps"]), made + int((want.lengths == 1).sum()))

  def test_greedy(self):
    _, want = _sample(self.model, self.prompts, "static", temperature=0.0, num_samples=1)
    _, got = _sample(self.model, self.prompts, "continuous", temperature=0.0, num_samples=1,
                     slots=2, page_size=4)
    assert_same(want, got)

  def test_a_requests_completion_does_not_depend_on_the_others(self):
    """Request r's draws come from fold_in(fold_in(key, r), t): the first prompt among other
    neighbours (other tokens, so other completion lengths and slot turns; of the same
    lengths, so the crowd's compiled program) is again request 0 .. G-1 and gets what it got
    in the crowd."""
    _, crowd = _sample(self.model, self.prompts, "continuous", **TWO_SLOTS)  # a test's above
    others = self.prompts[:1] + _prompts(5, (11, 3, 9, 14))
    _, first = _sample(self.model, others, "continuous", **TWO_SLOTS)
    self.assertFalse(np.array_equal(first.lengths[3:], crowd.lengths[3:]))  # other turns
    np.testing.assert_array_equal(first.tokens[:3], crowd.tokens[:3])
    np.testing.assert_array_equal(first.lengths[:3], crowd.lengths[:3])

  def test_budgets_end_rows_in_both_engines(self):
    """(The continuous engine's setting is SmallerPoolTest's first whole pool: its program.)"""
    budgets = np.random.RandomState(2).randint(1, 25, 15)
    outs = [_sample(self.model, self.prompts, engine, seed=1, budgets=budgets, **NO_EOS)[1]
            for engine in ("static", "continuous")]
    assert_same(*outs)
    np.testing.assert_array_equal(outs[0].lengths, budgets)  # no EOS ids: every budget reached
    self.assertTrue(outs[0].truncated.all())

  def test_bad_budgets_are_refused(self):
    sampler = sampling.Sampler(sampling.SamplingSettings(3, 24, engine="continuous"))
    with self.assertRaisesRegex(ValueError, r"budgets: expected 15 ints .* in \[1, 24\]"):
      sampler(self.model, self.prompts, 0, budgets=[25] * 15)
    with self.assertRaisesRegex(ValueError, "budgets: expected 15 ints"):
      sampler(self.model, self.prompts, 0, budgets=[4] * 14)

  @parameterized.parameters(({"data": 2, "fsdp": 2, "tensor": 2}, 5, "unrolled"),
                            ({"data": 4, "fsdp": 2, "tensor": 1}, 8, "scan"))
  @pytest.mark.mesh
  @pytest.mark.slow("the continuous engine's programs compiled over an 8-device mesh (its "
                    "collectives split across data, fsdp and tensor), beside the one-device "
                    "static reference")
  def test_on_a_mesh(self, shape, prompts, layer_loop):
    """One engine over a tensor-parallel mesh, or one engine per data shard (8 prompts over
    8 shards): the same completions as the static engine on one device (each layer loop on
    one of the meshes; both loops on one device are the tests above)."""
    prompts = _prompts(4, (5, 11, 3, 9, 14, 2, 7, 6))[:prompts]
    _, want = _sample(self.model, prompts, "static")
    placed = models.place(self.model, sh.make_mesh(shape))
    self.assertEqual(continuous.batch_shards(placed, len(prompts))[1],
                     1 if shape["tensor"] > 1 else 8)
    _, got = _sample(placed, prompts, "continuous", slots=8, page_size=4, layer_loop=layer_loop)
    assert_same(want, got)


class PagesTest(absltest.TestCase):

  def test_the_samples_of_a_prompt_share_its_prefilled_pages(self):
    """The pool holds each prompt's keys once (P x S0/Q pages, next to the slots' own pages),
    and they are the keys of a plain forward pass over the prompt (the run of
    SmallerPoolTest's second whole pool: 5 prompts in the layer scan's stacked pool)."""
    model = _model()
    sampler, _ = _sample(model, PROMPTS, "continuous", **SCAN)
    P, S0, Q, slots, N = 5, 16, 4, 8, 24  # prompts of at most 14 tokens: bucket 16
    own = -(-N // Q)
    self.assertEqual(continuous.pool_pages(P, S0, sampler.settings),
                     P * (S0 // Q) + slots * own + 1)
    pages_k = np.asarray(sampler.cache["pages_k"])  # [L, NP, K, Dh, Q]
    self.assertEqual(pages_k.shape[1], P * (S0 // Q) + slots * own + 1)
    tokens, mask = sampling.left_pad(PROMPTS, S0, 0)
    positions = models.positions_from_mask(mask)
    _, cache = jax.jit(lambda model, cache: models.forward(model, tokens, positions, mask, cache,
                                                           0))(  # one program, not op by op
        model, kv_cache.init_cache(model.config, P, S0))
    want = np.asarray(kv_cache.as_pages(cache, Q)["pages_k"])  # [L, P * S0/Q, K, Dh, Q]
    np.testing.assert_allclose(pages_k[:, :P * (S0 // Q)], want, atol=1e-5)

  def test_memory_follows_live_tokens(self):
    """Pages are taken as sequences grow and given back when they end: with one slot the
    most pages in use is one request's (of 15 requests), while the static engine holds every
    row's (the 1-slot run of SameAsStaticTest's third case, pages of 16 tokens)."""
    sampler, out = _sample(_model(), PROMPTS, "continuous", **ONE_SLOT)
    self.assertEqual(int(sampler.stats["peak_pages"]), -(-(int(out.lengths.max()) - 1) // 16))


class SmallerPoolTest(parameterized.TestCase):
  """`kv_pages` below every slot's worst case (8 slots x 6 pages of 4 tokens for 24 new
  tokens): requests wait for free pages, and a running one is preempted when a slot cannot
  grow, then recomputed from its prompt."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = _model()
    cls.prompts = PROMPTS  # 15 requests, 24 new tokens at most

  @parameterized.parameters((NO_EOS, 24), (SCAN, 14), (TWO_SLOTS, 6))
  def test_the_same_completions_as_the_whole_pool(self, kw, kv_pages):
    """Half the pool with every completion at 24 tokens (no stop ids; 8 slots, unrolled),
    under a third (8 slots, scanned), and one completion's worst case for 2 slots (unrolled;
    one slot at a time at the end): preempted requests start again and get the same tokens
    and log-probs, drawn from their own keys."""
    whole, want = _sample(self.model, self.prompts, "continuous", **kw)
    small, got = _sample(self.model, self.prompts, "continuous", kv_pages=kv_pages, **kw)
    assert_same(want, got)
    self.assertEqual(int(whole.stats["preemptions"]), 0)
    self.assertGreater(int(small.stats["preemptions"]), 0)  # restarts really happened
    self.assertLessEqual(int(small.stats["peak_pages"]), kv_pages)
    self.assertGreater(int(small.stats["steps"]), int(whole.stats["steps"]))

  @pytest.mark.mesh
  @pytest.mark.slow("the whole pool's engine and the per-shard engines, each its own program, "
                    "compiled over an 8-device mesh")
  def test_one_engine_per_data_shard(self):
    """8 prompts x G 3 over 8 data shards, one engine each (2 slots, 6 own pages instead of
    12): the whole pool's completions; the stats sum over the engines."""
    placed = models.place(self.model, sh.make_mesh({"data": 4, "fsdp": 2, "tensor": 1}))
    prompts = _prompts(4, (5, 11, 3, 9, 14, 2, 7, 6))
    kw = dict(slots=16, page_size=4, layer_loop="scan", eos_ids=())
    whole, want = _sample(placed, prompts, "continuous", **kw)
    small, got = _sample(placed, prompts, "continuous", kv_pages=6, **kw)
    assert_same(want, got)
    self.assertEqual(int(whole.stats["peak_pages"]), 8 * 12)  # every completion at 24 tokens
    self.assertEqual(int(small.stats["peak_pages"]), 8 * 6)
    self.assertGreater(int(small.stats["preemptions"]), 0)

  @pytest.mark.slow("a Qwen3-MoE model's continuous engine, whole pool and smaller one: two "
                    "programs of their own (the MoE layer's routing record threaded through)")
  def test_an_moe_models_routing_record_is_the_whole_pools(self):
    """Routing replay's record of every fed token's experts: a preempted request's row is
    cleared and recorded again as it is recomputed, as the whole pool recorded it."""
    model = _model("qwen3_moe")
    kw = dict(slots=8, page_size=4, layer_loop="scan", eos_ids=())
    _, want = _sample(model, self.prompts, "continuous", **kw)
    small, got = _sample(model, self.prompts, "continuous", kv_pages=12, **kw)
    self.assertGreater(int(small.stats["preemptions"]), 0)
    assert_same(want, got)
    np.testing.assert_array_equal(got.routing, want.routing)

  def test_pages_in_use_stay_in_the_pool_and_follow_the_live_tokens(self):
    """The pool holds the prompts' pages and `kv_pages`, not every slot's worst case; the
    most pages in use at once is at most that, and at least the longest completion's (the
    runs of the second case above)."""
    whole, _ = _sample(self.model, self.prompts, "continuous", **SCAN)
    small, out = _sample(self.model, self.prompts, "continuous", kv_pages=14, **SCAN)
    pool_pages = lambda sampler: sampler.cache["pages_k"].shape[1]  # [L, NP, K, Dh, Q]
    self.assertEqual(pool_pages(whole) - pool_pages(small), 8 * 6 - 14)
    self.assertEqual(whole.kv_bytes() - small.kv_bytes(), (8 * 6 - 14) * whole.kv_bytes()
                     // pool_pages(whole))
    peak = int(small.stats["peak_pages"])
    self.assertLessEqual(peak, 14)
    self.assertGreaterEqual(peak, -(-(int(out.lengths.max()) - 1) // 4))

  def test_the_compiled_sampler_holds_the_smaller_pool(self):
    """XLA's memory analysis of the program `launch.compile` compiles (from shapes alone):
    its arguments and outputs shrink by the pages left out, and nothing else grows."""
    def memory(kv_pages):  # the settings of the second case above (its programs compiled)
      settings = sampling.SamplingSettings(3, 24, 1.0, 40, 0.95, EOS_IDS, engine="continuous",
                                           slots=8, page_size=4, kv_pages=kv_pages,
                                           layer_loop="scan")
      sampler = sampling.Sampler(settings)
      pool = sum(x.size * x.dtype.itemsize
                 for x in jax.tree.leaves(sampler.cache_structs(self.model, 5, 14)))
      return pool, sampler.lower_shapes(self.model, 5, 14).compile().memory_analysis()
    whole_pool, whole = memory(0)
    small_pool, small = memory(14)
    cfg = self.model.config
    page_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4 * 4  # k and v, f32
    self.assertEqual(whole_pool - small_pool, (8 * 6 - 14) * page_bytes)
    self.assertEqual(whole.argument_size_in_bytes - small.argument_size_in_bytes,
                     whole_pool - small_pool)
    self.assertEqual(whole.output_size_in_bytes - small.output_size_in_bytes,
                     whole_pool - small_pool)
    self.assertLessEqual(small.temp_size_in_bytes, whole.temp_size_in_bytes)


class SettingsTest(absltest.TestCase):

  def test_slots(self):  # which engine 'auto' takes: tests/sampling/engine_kind_test.py
    self.assertEqual(continuous.engine_slots(sampling.SamplingSettings(2, 16), 64), 32)
    self.assertEqual(continuous.engine_slots(sampling.SamplingSettings(2, 16, slots=100), 64), 64)
    self.assertEqual(continuous.engine_slots(sampling.SamplingSettings(2, 16, slots=12), 64, 4), 3)
    with self.assertRaisesRegex(ValueError, r"engine='paged': expected one of"):
      sampling.SamplingSettings(2, 16, engine="paged")
    with self.assertRaisesRegex(ValueError, "page_size=0: expected >= 1"):
      sampling.SamplingSettings(2, 16, page_size=0)

  def test_kv_pages(self):
    """Each engine's own pages: the worst case for 0 or more, else as many as asked, at
    least one completion's worst case (16 new tokens in pages of 4: 4 pages)."""
    pages = lambda kv: continuous.pool_pages(2, 8, sampling.SamplingSettings(
        4, 16, slots=3, page_size=4, kv_pages=kv))
    self.assertEqual(pages(0), 2 * 2 + 3 * 4 + 1)
    self.assertEqual(pages(100), pages(0))
    self.assertEqual(pages(5), 2 * 2 + 5 + 1)
    self.assertEqual(pages(4), 2 * 2 + 4 + 1)
    for bad in (3, -1):
      with self.assertRaisesRegex(
          ValueError, rf"kv_pages={bad}: expected 0 \(every slot's worst case\) or at least 4 "
          r"\(the pages of one completion of max_new_tokens=16 in pages of page_size=4\)"):
        sampling.SamplingSettings(2, 16, page_size=4, kv_pages=bad)


if __name__ == "__main__":
  absltest.main()
