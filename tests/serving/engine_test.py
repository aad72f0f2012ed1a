"""The serving engine against the static sampler: a request's key, prompt and settings give
it the static engine's completion, whoever runs beside it and whenever it arrives."""
import concurrent.futures
import functools
import tempfile
import threading
import time

import jax
import numpy as np
from absl.testing import absltest, parameterized

from jaxrl_llm import models, sampling, serving
from tests import hf_testing

V = hf_testing.TINY["vocab_size"]
EOS_IDS = (3, 4, 5)  # stop ids: some completions stop (one at its first token), others
# reach their budget
N = 16  # max_tokens of every request here
SEED = 0
LENGTHS = (7, 11, 8, 9, 14, 10, 12, 13)  # more requests than slots; two buckets of each layout
# (slots, page_size, context, chunk_steps, top_logprobs): pages of 5 and 3 tokens, whose
# prompt buckets are 10 and 20 columns, or 12 and 15 (5 pages: 8 would not leave room for
# N new tokens in a context of 36).
LAYOUT_A = (3, 5, 40, 4, 5)
LAYOUT_B = (2, 3, 36, 7, 0)


@functools.cache
def _model_dir(seed=0):
  """A tiny random checkpoint, written once per process (this file's tests and those of
  the files that import it only read it)."""
  hf = hf_testing.make_hf_model("qwen2", seed=seed, num_hidden_layers=2)
  return hf_testing.save_hf_model(hf, tempfile.mkdtemp())


@functools.cache
def _model(seed=0, dtype="float32"):
  """`_model_dir(seed)` loaded once (no test changes a model)."""
  return models.from_pretrained(_model_dir(seed), dtype)


def _prompts(seed, lengths):
  rng = np.random.RandomState(seed)
  return [[int(t) for t in rng.randint(7, V, n)] for n in lengths]


def _layout(slots, page, context, chunk, top):
  return serving.Layout(slots=slots, context=context, page_size=page, chunk_steps=chunk,
                        top_logprobs=top)


def _engine(model, layout, **kw):
  settings = sampling.SamplingSettings(1, layout.context, eos_ids=EOS_IDS, pad_id=0,
                                       page_size=layout.page_size)
  return serving.Engine(model, settings, layout, **kw)


@functools.cache
def _static_sampler(temperature, top_p):
  settings = sampling.SamplingSettings(1, N, temperature, top_p=top_p, eos_ids=EOS_IDS, pad_id=0,
                                       engine="static")
  return sampling.Sampler(settings)  # one per setting: its program traced once


_STATIC = {}


def _static(model, prompts, temperature=1.0, top_p=0.9, seed=SEED):
  """The static engine's completions, one per prompt (row r is request r); computed once
  per model (of `_model`), prompts and setting."""
  key = (id(model), tuple(map(tuple, prompts)), temperature, top_p, seed)
  if key not in _STATIC:
    _STATIC[key] = jax.device_get(_static_sampler(temperature, top_p)(
        model, prompts, SEED if seed is None else seed))
  return _STATIC[key]


def _keys(seed, num):
  """Request r's key in a static call with `seed`: fold_in(PRNGKey(seed), r), as raw data."""
  return np.asarray(sampling.request_keys(jax.random.PRNGKey(seed), num))


def _requests(prompts, temperature=1.0, top_p=0.9, seed=SEED, **kw):
  keys = _keys(seed, len(prompts))
  return [serving.Request(p, N, temperature, top_p, key=keys[r], **kw)
          for r, p in enumerate(prompts)]


def _run(engine, requests):
  futures = [engine.submit(r) for r in requests]
  return [f.result(timeout=300) for f in futures]


class EngineTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = _model()
    cls.prompts = _prompts(0, LENGTHS)
    cls.want = _static(cls.model, cls.prompts)
    cls.engines = {}

  @classmethod
  def tearDownClass(cls):
    for engine in cls.engines.values():
      engine.close()
    super().tearDownClass()

  def engine(self, layout=LAYOUT_A):
    if layout not in self.engines:
      self.engines[layout] = _engine(self.model, _layout(*layout))
    return self.engines[layout]

  def assert_static_row(self, want, r, got: serving.Completion, msg=""):
    n = int(want.lengths[r])
    self.assertEqual(got.tokens, want.tokens[r, :n].tolist(), f"request {r} {msg}")
    self.assertEqual(got.finish_reason, "length" if want.truncated[r] else "stop",
                     f"request {r} {msg}")
    np.testing.assert_allclose(got.logprobs, want.logprobs[r, :n], atol=1e-5,
                               err_msg=f"request {r} {msg}")

  @parameterized.parameters(LAYOUT_A, LAYOUT_B)
  def test_each_request_gets_the_static_engines_completion(self, *layout):
    """Float32, temperature 1, top-p 0.9: 8 requests of 8 lengths through 2 or 3 slots, pages
    of 5 or 3 tokens; each gets the static engine's tokens, finish reason, log-probs."""
    reasons = {"length" if t else "stop" for t in self.want.truncated}
    self.assertEqual(reasons, {"length", "stop"})  # both ends are exercised
    self.assertGreater(len(set(self.want.lengths.tolist())), 3)
    engine = self.engine(layout)
    got = _run(engine, _requests(self.prompts))
    for r, completion in enumerate(got):
      self.assert_static_row(self.want, r, completion)
      self.assertIsNone(completion.top_logprobs)
      self.assertEqual(completion.policy_version, 0)

  def test_requests_from_threads_at_staggered_times(self):
    """Requests arriving from 8 threads while others decode get what they get alone."""
    engine = self.engine()
    requests = _requests(self.prompts)
    alone = [_run(engine, [r])[0] for r in requests]
    futures = [None] * len(requests)

    def send(r):
      time.sleep(0.0015 * r)
      futures[r] = engine.submit(requests[r])

    threads = [threading.Thread(target=send, args=(r,)) for r in range(len(requests))]
    for t in threads:
      t.start()
    busy, deadline = 0, time.monotonic() + 300
    while not all(f is not None and f.done() for f in futures) and time.monotonic() < deadline:
      busy = max(busy, engine.busy)
      time.sleep(0.0002)
    for t in threads:
      t.join()
    together = [f.result(timeout=300) for f in futures]
    self.assertGreater(busy, 1, "the requests never overlapped")
    for r, (a, b) in enumerate(zip(alone, together)):
      self.assertEqual(b.tokens, a.tokens, f"request {r}")
      self.assertEqual(b.finish_reason, a.finish_reason, f"request {r}")
      np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5, err_msg=f"request {r}")
      self.assert_static_row(self.want, r, b, "(threads)")

  def test_greedy_rows_beside_sampled_rows(self):
    """Every other request is greedy (temperature 0); each row gets its own engine's
    completion: the static greedy one, or the static sampled one."""
    greedy = _static(self.model, self.prompts, temperature=0.0, top_p=1.0)
    sampled = _requests(self.prompts)
    requests = [serving.Request(p, N, 0.0, 1.0, seed=1234 + r) if r % 2 else sampled[r]
                for r, p in enumerate(self.prompts)]
    got = _run(self.engine(), requests)
    for r, completion in enumerate(got):
      self.assert_static_row(greedy if r % 2 else self.want, r, completion,
                             "greedy" if r % 2 else "sampled")
    # Greedy differs from sampling somewhere: the comparison above tells them apart.
    self.assertNotEqual([c.tokens for c in got[1::2]],
                        [self.want.tokens[r, :self.want.lengths[r]].tolist()
                         for r in range(1, len(got), 2)])

  def test_top_logprobs(self):
    """Alternatives are the k most likely tokens under the request's temperature, sorted,
    with the log-probs of the model's own forward pass; the chosen token's log-prob too."""
    prompts = self.prompts[:3]
    keys = _keys(7, 3)
    requests = [serving.Request(prompts[0], N, 0.0, 1.0, seed=0, top_logprobs=3),
                serving.Request(prompts[1], N, 1.0, 0.9, key=keys[1], top_logprobs=5),
                serving.Request(prompts[2], N, 0.7, 1.0, key=keys[2], top_logprobs=2),
                serving.Request(prompts[0], N, 1.0, 0.9, key=keys[0])]  # asks for none
    got = _run(self.engine(), requests)
    self.assertIsNone(got[3].top_logprobs)
    # The reference: one forward pass over each prompt and completion (right-padded: the
    # model is causal, so the padding changes no earlier position).
    seqs = [r.prompt + c.tokens for r, c in zip(requests[:3], got[:3])]
    T = max(len(x) for x in seqs)
    ids = np.asarray([x + [0] * (T - len(x)) for x in seqs])
    all_logits = np.asarray(models.compute_logits(self.model, ids, np.ones_like(ids)))
    for request, c, logits in zip(requests[:3], got[:3], all_logits):
      k, n = request.top_logprobs, len(c.tokens)
      self.assertLen(c.top_logprobs, n)
      ids = np.asarray([[a for a, _ in alts] for alts in c.top_logprobs])
      lps = np.asarray([[lp for _, lp in alts] for alts in c.top_logprobs])
      self.assertEqual(ids.shape, (n, k))
      self.assertTrue(np.all(np.diff(lps, axis=1) <= 0), f"not sorted: {lps}")
      scaled = logits[len(request.prompt) - 1:][:n].astype(np.float64) / (
          request.temperature or 1.0)
      logp = scaled - np.logaddexp.reduce(scaled, axis=-1, keepdims=True)
      order = np.argsort(-logp, axis=-1, kind="stable")[:, :k]
      np.testing.assert_array_equal(ids, order)  # the first one is the most likely token
      np.testing.assert_allclose(lps, np.take_along_axis(logp, order, axis=-1), atol=1e-5)
      np.testing.assert_allclose(c.logprobs, logp[np.arange(n), c.tokens], atol=1e-5)
      if request.temperature == 0:
        self.assertEqual(c.tokens, ids[:, 0].tolist())  # greedy takes the first alternative

  def test_check_names_the_field(self):
    engine = self.engine()  # context 40, pages of 5
    ok = serving.Request([5] * 35, 5)
    engine.check(ok)
    cases = [(serving.Request([5] * 36, 5), r"36 tokens and max_tokens=5 do not fit the context "
              r"of 40 tokens"),
             (serving.Request([5] * 3, 41), r"max_tokens=41 do not fit the context of 40"),
             (serving.Request([5] * 3, 0), r"max_tokens=0: expected >= 1"),
             (serving.Request([], 4), r"prompt: expected at least one token"),
             (serving.Request([5] * 3, 4, top_logprobs=6), r"top_logprobs=6: expected 0\.\.5"),
             (serving.Request([5] * 3, 4, temperature=-1.0), r"temperature=-1\.0"),
             (serving.Request([5] * 3, 4, top_p=0.0), r"top_p=0\.0")]
    for request, message in cases:
      with self.assertRaisesRegex(ValueError, message):
        engine.check(request)
      with self.assertRaisesRegex(ValueError, message):  # submit refuses it too, queues nothing
        engine.submit(request)
    self.assertEqual(engine.busy, 0)
    without_alternatives = self.engine(LAYOUT_B)
    with self.assertRaisesRegex(ValueError, r"top_logprobs=1: expected 0\.\.0"):
      without_alternatives.check(serving.Request([5] * 3, 4, top_logprobs=1))

  def test_publish_changes_the_weights_and_the_version(self):
    engine = self.engine()
    other = _model(seed=1)
    want_other = _static(other, self.prompts)
    self.assertNotEqual(want_other.tokens.tolist(), self.want.tokens.tolist())
    try:
      engine.publish(other, version=7)
      self.assertEqual(engine.version, 7)
      got = _run(engine, _requests(self.prompts))
      for r, completion in enumerate(got):
        self.assertEqual(completion.policy_version, 7)
        self.assert_static_row(want_other, r, completion, "(published weights)")
    finally:
      engine.publish(self.model, version=0)
    got = _run(engine, _requests(self.prompts[:2]))
    for r, completion in enumerate(got):
      self.assertEqual(completion.policy_version, 0)
      self.assert_static_row(self.want, r, completion, "(weights published back)")

  def test_publish_after_running_keeps_each_completion_one_version(self):
    # Requests decoding at the publish end under the weights they began with; the publish
    # returns when they have, and a request submitted meanwhile runs the new weights.
    engine = self.engine()
    other = _model(seed=1)
    want_other = _static(other, self.prompts)
    requests = _requests(self.prompts)
    try:
      admitted = engine.stats["admitted"]
      before = [engine.submit(r) for r in requests[:2]]
      while engine.stats["admitted"] < admitted + 2:  # both decoding
        time.sleep(0.001)
      engine.publish(other, version=5, after_running=True)
      self.assertTrue(all(f.done() for f in before))
      after = engine.submit(requests[2]).result()
    finally:
      engine.publish(self.model, version=0)
    for r, future in enumerate(before):
      self.assertEqual(future.result().policy_version, 0)
      self.assert_static_row(self.want, r, future.result(), "(begun before the publish)")
    self.assertEqual(after.policy_version, 5)
    self.assert_static_row(want_other, 2, after, "(after the publish)")


class QueueTest(absltest.TestCase):
  """Engines of LAYOUT_A over the same model: their programs come from the compilation
  cache of EngineTest's."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = _model()
    cls.prompts = _prompts(0, LENGTHS)

  def test_queue_full(self):
    """3 slots, 2 may wait: of 8 requests sent at once, the ones beyond are refused and the
    accepted ones complete as the static engine does."""
    engine = _engine(self.model, _layout(*LAYOUT_A), max_waiting=2)
    try:
      accepted, refused = {}, []
      for r, request in enumerate(_requests(self.prompts)):
        try:
          accepted[r] = engine.submit(request)
        except serving.QueueFull as e:
          refused.append(r)
          self.assertIn("max_waiting=2", str(e))
      # At most 3 requests decode and 2 wait (none ends while 8 are submitted); the first
      # 2 are always taken.
      self.assertBetween(len(refused), 3, 6)
      want = _static(self.model, self.prompts)
      for r, future in accepted.items():
        got = future.result(timeout=300)
        n = int(want.lengths[r])
        self.assertEqual(got.tokens, want.tokens[r, :n].tolist())
      # Once the queue drains, requests are accepted again.
      self.assertLen(_run(engine, _requests(self.prompts[:2])), 2)
    finally:
      engine.close()

  def test_close_fails_pending_futures(self):
    engine = _engine(self.model, _layout(*LAYOUT_A))
    futures = [engine.submit(r) for r in _requests(self.prompts)]
    deadline = time.monotonic() + 120
    while not engine.stats["admitted"] and time.monotonic() < deadline:
      time.sleep(0.001)  # close while requests decode
    self.assertGreater(engine.stats["admitted"], 0)
    engine.close()
    failed = 0
    for future in futures:
      self.assertTrue(future.done())
      error = future.exception(timeout=0)
      if error is not None:
        self.assertIsInstance(error, RuntimeError)
        self.assertIn("closed", str(error))
        failed += 1
      else:
        self.assertIsInstance(future.result(), serving.Completion)
    # 3 slots: at least the 5 requests that never had one were waiting.
    self.assertGreaterEqual(failed, 5)
    with self.assertRaisesRegex(RuntimeError, "closed"):
      engine.submit(_requests(self.prompts)[0])

  def test_close_twice(self):
    """A second close() (a `finally` after an explicit close) does nothing."""
    engine = _engine(self.model, _layout(*LAYOUT_A))
    futures = [engine.submit(r) for r in _requests(self.prompts)]
    engine.close()
    try:
      engine.close()
    except concurrent.futures.InvalidStateError as e:
      self.fail("Engine.close() a second time sets the exception of futures the first close "
                f"already failed (it never clears _waiting/_running): {e!r}")
    self.assertTrue(all(f.done() for f in futures))


class Bfloat16Test(absltest.TestCase):

  def test_same_tokens_as_the_static_sampler(self):
    model = _model(dtype="bfloat16")
    self.assertEqual(model.config.jnp_dtype, jax.numpy.bfloat16)
    prompts = _prompts(0, LENGTHS)
    want = _static(model, prompts)
    engine = _engine(model, _layout(*LAYOUT_A))
    try:
      got = _run(engine, _requests(prompts))
    finally:
      engine.close()
    for r, completion in enumerate(got):
      n = int(want.lengths[r])
      self.assertEqual(completion.tokens, want.tokens[r, :n].tolist(), f"request {r}")
      self.assertEqual(completion.finish_reason, "length" if want.truncated[r] else "stop")
      np.testing.assert_allclose(completion.logprobs, want.logprobs[r, :n], atol=0.05)


if __name__ == "__main__":
  absltest.main()
