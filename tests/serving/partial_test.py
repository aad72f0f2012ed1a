"""Partial rollouts on the serving engine's slots: a request that spans a publish goes on under
the new weights, and each token's behaviour log-prob is one forward of the version that
sampled it over the whole sequence (float32, 1e-5)."""
import json

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from jaxrl_llm import models, sampling, serving
from tests.serving import engine_test

N = 24
BUDGETS = (6, 20, 24, 9, 24, 16)  # requests end at different steps, others mid-way
EOS_IDS = (3,)  # rarely drawn: most requests run to their budget
CONTEXT = 48


def _engine(model):
  layout = serving.Layout(slots=3, context=CONTEXT, page_size=4, chunk_steps=4, top_logprobs=0)
  settings = sampling.SamplingSettings(1, N, 1.0, eos_ids=EOS_IDS, pad_id=0, page_size=4)
  return serving.PartialEngine(model, settings, layout, version=0)


@jax.jit
def _forward_logprobs(model, ids):
  """log_softmax of `model`'s logits [B, T, V] over right-padded sequences `ids` [B, T]: one
  forward over each whole sequence (the model is causal: the padding after a sequence
  changes none of its log-probs)."""
  mask = jnp.ones_like(ids)
  logits = models.forward(model, ids, models.positions_from_mask(mask), mask)[0]
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def _until(n):
  """Stops a run once `n` requests have ended."""
  ended = []
  return lambda new: ended.extend(new) or len(ended) >= n


class PartialEngineTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.versions = {v: engine_test._model(seed=v) for v in (0, 1, 2)}  # pylint: disable=protected-access
    cls.prompts = engine_test._prompts(0, (7, 11, 8, 9, 14, 10))
    cls.keys = engine_test._keys(0, len(cls.prompts))
    cls.played = cls._play()

  @classmethod
  def _play(cls, oldest_at_2=None):
    """Every request, with publishes of versions 1 and 2 once 1 and then 2 more have ended."""
    engine = _engine(cls.versions[0])
    for r, p in enumerate(cls.prompts):
      engine.submit(r, p, BUDGETS[r], cls.keys[r])
    done = engine.run(_until(1))
    engine.publish(cls.versions[1], 1)
    done += engine.run(_until(2))
    engine.publish(cls.versions[2], 2, oldest=oldest_at_2)
    return done + engine.run(lambda ended: False), engine

  def assert_each_token_from_its_version(self, done):
    # log p(tokens[t] | prompt, tokens[:t]) under each version, every request in one call
    # (padded to the context: one program for every version and call).
    ids = np.zeros((len(done), CONTEXT), np.int32)
    for i, f in enumerate(done):
      seq = self.prompts[f.id] + f.tokens
      ids[i, :len(seq)] = seq
    logp = {v: np.asarray(_forward_logprobs(self.versions[v], ids))
            for v in sorted({v for f in done for v in f.versions})}
    for i, f in enumerate(done):
      at = np.arange(len(f.tokens)) + len(self.prompts[f.id]) - 1
      want = {v: logp[v][i, at, np.asarray(f.tokens)] for v in set(f.versions)}
      expected = [want[v][t] for t, v in enumerate(f.versions)]
      np.testing.assert_allclose(f.logprobs, expected, atol=1e-5, err_msg=f"request {f.id}")

  def test_each_token_is_sampled_and_scored_by_its_own_version(self):
    done, engine = self.played
    self.assertEqual(sorted(f.id for f in done), list(range(len(self.prompts))))
    spanning = [f for f in done if len(set(f.versions)) > 1]
    self.assertTrue(any(len(set(f.versions)) == 3 for f in spanning), "no request spans both")
    for f in done:
      self.assertEqual(f.versions, sorted(f.versions))  # versions only move forward
    self.assert_each_token_from_its_version(done)
    self.assertEqual(engine.restarted, 0)

  def test_a_snapshot_restored_into_a_new_engine_goes_on_the_same(self):
    """Also: the order is fixed by the requests, so the run repeats exactly."""
    want, _ = self.played
    engine = _engine(self.versions[0])
    for r, p in enumerate(self.prompts):
      engine.submit(r, p, BUDGETS[r], self.keys[r])
    done = engine.run(_until(1))
    snapshot = json.loads(json.dumps(engine.snapshot()))  # as a checkpoint keeps it
    self.assertTrue(snapshot["running"] and snapshot["waiting"])
    engine = _engine(self.versions[1])
    engine.restore(snapshot)
    engine.publish(self.versions[1], 1)
    done += engine.run(_until(2))
    engine.publish(self.versions[2], 2)
    done += engine.run(lambda ended: False)
    self.assertEqual([(f.id, f.tokens, f.versions) for f in done],
                     [(f.id, f.tokens, f.versions) for f in want])
    np.testing.assert_array_equal(np.concatenate([f.logprobs for f in done]),
                                  np.concatenate([f.logprobs for f in want]))

  def test_requests_older_than_the_bound_start_again(self):
    done, engine = self._play(oldest_at_2=1)
    first = {f.id for f in self.played[0][:1]}
    self.assertGreater(engine.restarted, 0)
    for f in done:
      if f.id not in first:  # ended before the first publish: version 0 throughout
        self.assertGreaterEqual(min(f.versions), 1, f"request {f.id}")
    self.assert_each_token_from_its_version(done)


if __name__ == "__main__":
  absltest.main()
