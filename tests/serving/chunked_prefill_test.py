"""Chunked prefill (`Layout.prefill_chunk`): a long prompt prefilled in pieces gives the
whole prefill's completion, and the requests already decoding go on while it goes in."""
import numpy as np
from absl.testing import absltest, parameterized

from jaxrl_llm import sampling, serving
from tests.serving import engine_test

V, N = engine_test.V, engine_test.N
# Pages of 4 tokens, pieces of 2 pages. Prompt columns: 4 and 8 (one piece: `slots.admit`),
# 16, 32 and 64 (2, 4 and 8 pieces), 68 (17 pages: 9 pieces, the last overlapping the one
# before).
LENGTHS = (3, 7, 9, 30, 41, 65)
PIECE = 8


def _layout(prefill_chunk, slots=3, context=96, chunk_steps=4):
  return serving.Layout(slots=slots, context=context, page_size=4, chunk_steps=chunk_steps,
                        top_logprobs=0, prefill_chunk=prefill_chunk)


class ChunkedPrefillTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = engine_test._model()  # pylint: disable=protected-access
    cls.prompts = engine_test._prompts(3, LENGTHS)  # pylint: disable=protected-access
    cls.whole = engine_test._engine(cls.model, _layout(0))  # pylint: disable=protected-access
    cls.chunked = engine_test._engine(cls.model, _layout(PIECE))  # pylint: disable=protected-access

  @classmethod
  def tearDownClass(cls):
    cls.whole.close()
    cls.chunked.close()
    super().tearDownClass()

  def assert_same(self, want: serving.Completion, got: serving.Completion, msg):
    self.assertEqual(got.tokens, want.tokens, msg)
    self.assertEqual(got.finish_reason, want.finish_reason, msg)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5, err_msg=msg)

  def test_pieces_give_the_whole_prefills_completion(self):
    """Float32, temperature 1, top-p 0.9, the same keys: prompts of 1 to 9 pieces get the
    whole-prefill engine's tokens, log-probs and finish reasons."""
    requests = engine_test._requests(self.prompts)  # pylint: disable=protected-access
    pieces = self.chunked.stats["pieces"]
    want = engine_test._run(self.whole, requests)  # pylint: disable=protected-access
    got = engine_test._run(self.chunked, requests)  # pylint: disable=protected-access
    for r, (w, g) in enumerate(zip(want, got)):
      self.assert_same(w, g, f"request {r} ({LENGTHS[r]} prompt tokens)")
    # 0 + 0 + 1 + 3 + 7 + 8 pieces before the last ones: the pieces did run.
    self.assertEqual(self.chunked.stats["pieces"] - pieces, 19)
    self.assertEqual(self.whole.stats["pieces"], 0)
    self.assertGreater(len({len(c.tokens) for c in want}), 1)  # some stop early

  def test_a_sessions_long_continuation(self):
    """A session's next turn with 20 new tokens (32 columns: 4 pieces) after its kept
    sequence gets the whole-prefill engine's completion."""
    prompts = self.prompts[1:3]
    requests = engine_test._requests(prompts, session=None)  # pylint: disable=protected-access
    keys = engine_test._keys(9, len(prompts))  # pylint: disable=protected-access
    results = {}
    for name, engine in (("whole", self.whole), ("chunked", self.chunked)):
      extended = engine.stats["extended"]
      for r, request in enumerate(requests):
        request.session = f"{name} {r}"
      first = engine_test._run(engine, requests)  # pylint: disable=protected-access
      rng = np.random.RandomState(5)
      turns = [serving.Request(p + c.tokens + [int(t) for t in rng.randint(7, V, 20)], N,
                               1.0, 0.9, key=keys[r], session=f"{name} {r}")
               for r, (p, c) in enumerate(zip(prompts, first))]
      pieces = engine.stats["pieces"]
      results[name] = first + engine_test._run(engine, turns)  # pylint: disable=protected-access
      self.assertEqual(engine.stats["extended"] - extended, len(prompts), name)
      # 21 new tokens (the last sampled one first) in 32 columns: 3 pieces, then the last.
      self.assertEqual(engine.stats["pieces"] - pieces, 3 * len(prompts) if engine is
                       self.chunked else 0, name)
    for r, (w, g) in enumerate(zip(results["whole"], results["chunked"])):
      self.assert_same(w, g, f"turn {r // len(prompts) + 1} of session {r % len(prompts)}")

  @parameterized.parameters(PIECE, 0)
  def test_a_running_request_decodes_while_a_long_prompt_goes_in(self, prefill_chunk):
    """A request of 3 tokens (one decode step a chunk) and one whose 40-token prompt takes
    5 pieces arrive together: the first ends before the second's first token is chosen
    (with pieces; whole, the long prompt goes in before the first decode chunk)."""
    settings = sampling.SamplingSettings(1, 64, pad_id=0, page_size=4)  # no EOS: budgets end
    engine = serving.Engine(self.model, settings,
                            _layout(prefill_chunk, slots=2, context=64, chunk_steps=1))
    short = serving.Request(self.prompts[0], 3, 1.0, 1.0, seed=0)
    long = serving.Request(list(np.random.RandomState(1).randint(7, V, 40)), 4, seed=1)
    seen = {}
    try:
      # Holding the engine's lock, both are queued before its thread can take either.
      with engine._wake:  # pylint: disable=protected-access
        short_done = engine.submit(short)
        long_done = engine.submit(long)
        short_done.add_done_callback(lambda _: seen.update(engine.stats))  # engine's thread
      self.assertLen(short_done.result(timeout=300).tokens, 3)
      self.assertLen(long_done.result(timeout=300).tokens, 4)
    finally:
      engine.close()
    if prefill_chunk:
      self.assertEqual(seen["admitted"], 1, seen)  # the long prompt's first token: not yet
      self.assertBetween(seen["pieces"], 1, 3, seen)  # while its pieces went in
      self.assertEqual(engine.stats["pieces"], 4)
    else:
      self.assertEqual(seen["admitted"], 2, seen)
      self.assertEqual(seen["pieces"], 0, seen)

  def test_layout_refuses_a_piece_of_part_of_a_page(self):
    for bad in (-4, 6):
      with self.assertRaisesRegex(ValueError, rf"prefill_chunk={bad}: expected 0 \(whole "
                                  r"prompts\) or a positive multiple of page_size=4"):
        _layout(bad)


if __name__ == "__main__":
  absltest.main()
