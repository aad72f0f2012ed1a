"""The continuous engine against the static one: same requests and keys, same completions."""
import tempfile

import jax
import numpy as np
from absl.testing import absltest, parameterized

from jaxrl_llm import models, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import kv_cache
from jaxrl_llm.sampling import continuous
from tests import hf_testing

V = hf_testing.TINY["vocab_size"]
EOS_IDS = (3, 4, 5, 6)  # several stop ids: completions end at many different lengths


def _model(arch="qwen2"):
  hf = hf_testing.make_hf_model(arch)
  return models.from_pretrained(hf_testing.save_hf_model(hf, tempfile.mkdtemp()))


def _prompts(seed, lengths):
  rng = np.random.RandomState(seed)
  return [[int(t) for t in rng.randint(7, V, n)] for n in lengths]


def _sample(model, prompts, engine, seed=3, **kw):
  settings = dict(num_samples=3, max_new_tokens=24, temperature=1.0, eos_ids=EOS_IDS)
  settings.update(kw)
  sampler = sampling.Sampler(sampling.SamplingSettings(engine=engine, **settings))
  return sampler, jax.device_get(sampler(model, prompts, seed))


class SameAsStaticTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = _model()
    cls.prompts = _prompts(0, (5, 11, 3, 9, 14))  # 15 requests

  def assert_same(self, want, got):
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.mask, want.mask)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(got.truncated, want.truncated)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)

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
    self.assert_same(want, got)
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
    self.assert_same(want, got)

  def test_a_requests_completion_does_not_depend_on_the_others(self):
    """Request r's draws come from fold_in(fold_in(key, r), t): asking for the prompt alone
    (it is then request 0 .. G-1) with the key of its index gives what it got in the crowd."""
    _, crowd = _sample(self.model, self.prompts, "continuous", slots=3, page_size=4)
    _, first = _sample(self.model, self.prompts[:1], "continuous", slots=1, page_size=4)
    np.testing.assert_array_equal(first.tokens, crowd.tokens[:3])

  def test_budgets_end_rows_in_both_engines(self):
    budgets = np.random.RandomState(2).randint(1, 25, 15)
    outs = []
    for engine in ("static", "continuous"):
      sampler = sampling.Sampler(sampling.SamplingSettings(3, 24, 1.0, engine=engine, slots=4,
                                                           page_size=4))
      outs.append(jax.device_get(sampler(self.model, self.prompts, 1, budgets=budgets)))
    self.assert_same(*outs)
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
    self.assert_same(want, got)


class PagesTest(absltest.TestCase):

  def test_the_samples_of_a_prompt_share_its_prefilled_pages(self):
    """The pool holds each prompt's keys once (P x S0/Q pages, next to the slots' own pages),
    and they are the keys of a plain forward pass over the prompt."""
    model = _model("llama")
    prompts = _prompts(1, (6, 8))
    G, Q, slots, N = 4, 4, 3, 10
    settings = sampling.SamplingSettings(G, N, 1.0, engine="continuous", slots=slots,
                                         page_size=Q, layer_loop="scan")
    sampler = sampling.Sampler(settings, buckets=(8,))
    sampler(model, prompts, 0)
    S0 = 8
    own = -(-N // Q)
    self.assertEqual(continuous.pool_pages(2, S0, settings), 2 * (S0 // Q) + slots * own + 1)
    pages_k = np.asarray(sampler.cache["pages_k"])  # [L, NP, K, Dh, Q]
    self.assertEqual(pages_k.shape[1], 2 * (S0 // Q) + slots * own + 1)
    tokens, mask = sampling.left_pad(prompts, S0, 0)
    cache = kv_cache.init_cache(model.config, 2, S0)
    _, cache = models.forward(model, tokens, models.positions_from_mask(mask), mask, cache, 0)
    want = np.asarray(kv_cache.as_pages(cache, Q)["pages_k"])  # [L, 2 * S0/Q, K, Dh, Q]
    np.testing.assert_allclose(pages_k[:, :2 * (S0 // Q)], want, atol=1e-5)

  def test_memory_follows_live_tokens(self):
    """Pages are taken as sequences grow and given back when they end: with one slot the
    most pages in use is one request's, while the static engine holds every row's."""
    model = _model("llama")
    settings = sampling.SamplingSettings(4, 16, 1.0, engine="continuous", slots=1, page_size=4)
    sampler = sampling.Sampler(settings)
    out = sampler(model, _prompts(2, (5, 7)), 0)
    self.assertEqual(int(sampler.stats["peak_pages"]), -(-(int(out.lengths.max()) - 1) // 4))


class SettingsTest(absltest.TestCase):

  def test_auto_engine_and_slots(self):
    self.assertEqual(sampling.SamplingSettings(2, 64).resolved_engine(), "static")
    self.assertEqual(sampling.SamplingSettings(2, 1024).resolved_engine(), "continuous")
    self.assertEqual(continuous.engine_slots(sampling.SamplingSettings(2, 16), 64), 32)
    self.assertEqual(continuous.engine_slots(sampling.SamplingSettings(2, 16, slots=100), 64), 64)
    self.assertEqual(continuous.engine_slots(sampling.SamplingSettings(2, 16, slots=12), 64, 4), 3)
    with self.assertRaisesRegex(ValueError, r"engine='paged': expected one of"):
      sampling.SamplingSettings(2, 16, engine="paged")
    with self.assertRaisesRegex(ValueError, "page_size=0: expected >= 1"):
      sampling.SamplingSettings(2, 16, page_size=0)


if __name__ == "__main__":
  absltest.main()
