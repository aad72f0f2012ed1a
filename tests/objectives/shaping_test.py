"""DAPO extras, the truncated importance weight and the behaviour mask."""
import math

from absl.testing import absltest
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxrl_llm.config import schema
from jaxrl_llm import objectives


class ShapingTest(absltest.TestCase):

  def test_overlong_penalty(self):
    # L_max = 20, L_cache = 5: safe up to 15. |y| = 10, 15 -> 0; 17 -> (15 - 17)/5 = -0.4;
    # 20 -> (15 - 20)/5 = -1; 21 -> -1 (beyond L_max).
    got = objectives.overlong_penalty(jnp.array([10, 15, 17, 20, 21]), 20, 5)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.4, -1.0, -1.0], atol=1e-6)
    # No graded zone: only past L_max.
    np.testing.assert_allclose(objectives.overlong_penalty(jnp.array([20, 21]), 20, 0), [0, -1])

  def test_overlong_shaped_rewards(self):
    cfg = ml_collections.ConfigDict({"enabled": True, "max_len": 20, "cache_len": 5})
    rewards = jnp.array([1.0, 1.0])
    np.testing.assert_allclose(
        objectives.overlong_shaped_rewards(rewards, jnp.array([10, 17]), cfg), [1.0, 0.6])
    cfg.enabled = False
    np.testing.assert_allclose(
        objectives.overlong_shaped_rewards(rewards, jnp.array([10, 17]), cfg), [1.0, 1.0])

  def test_drop_truncated(self):
    mask = jnp.ones((2, 3))
    np.testing.assert_array_equal(
        objectives.drop_truncated(mask, jnp.array([True, False])), [[0, 0, 0], [1, 1, 1]])

  def test_dynamic_sampling_keep(self):
    rewards = jnp.array([[1.0, 0, 1], [0.3, 0.3, 0.3], [0, 0, 0], [0, 0, 0.5]])
    np.testing.assert_array_equal(objectives.dynamic_sampling_keep(rewards),
                                  [True, False, False, True])

  def test_truncated_importance_weight(self):
    # exp(0.5) = 1.6487 capped at 1.5; exp(-0.5) = 0.606531 kept.
    w = objectives.truncated_importance_weight(jnp.array([[0.0, -1.0]]),
                                               jnp.array([[-0.5, -0.5]]), 1.5)
    np.testing.assert_allclose(w, [[1.5, math.exp(-0.5)]], rtol=1e-6)

  def test_importance_weight_on_advantages_weights_each_token_loss(self):
    # Clip 0.2, token_mean, A = [1, -1], ρ = [1.5, 0.9], weights w = [0.5, 2]:
    # token losses -min(1.5, 1.2) = -1.2 and -min(-0.9, -0.9) = 0.9;
    # weighted mean (0.5·-1.2 + 2·0.9)/2 = 0.6.
    cfg = schema.algo_config(schema.sampling_config())
    cfg.kl.coef, cfg.loss.aggregation = 0.0, "token_mean"
    logp = jnp.array([[-1.0, -1.0]])
    old = logp - jnp.log(jnp.array([[1.5, 0.9]]))
    adv = jnp.array([[1.0, -1.0]]) * jnp.array([[0.5, 2.0]])
    loss, _ = objectives.policy_loss(logp, old, adv, jnp.ones((1, 2)), cfg)
    np.testing.assert_allclose(loss, 0.6, atol=1e-6)



def _mask_cfg(level):
  return ml_collections.ConfigDict({"level": level, "low": 0.5, "high": 2.0})


class BehaviourMaskTest(absltest.TestCase):
  # o = 0 everywhere, so w = exp(-b). Row 0: w = [1, 1/4, 4] (geometric mean 1);
  # row 1: w = [1.5, 1.5] and a padding slot; row 2: w = [3, 3, 0.6] (geometric mean
  # (3·3·0.6)^(1/3) = 1.754). Valid tokens: 3 + 2 + 3 = 8.
  old = jnp.zeros((3, 3))
  behaviour = -jnp.log(jnp.array([[1.0, 0.25, 4.0], [1.5, 1.5, 9.0], [3.0, 3.0, 0.6]]))
  mask = jnp.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], jnp.int32)

  def test_token_level(self):
    # Out of [0.5, 2]: w = 1/4 and 4 (row 0), 3 and 3 (row 2): 4 of 8 valid tokens.
    kept, frac = objectives.behaviour_mask(self.old, self.behaviour, self.mask, _mask_cfg("token"))
    np.testing.assert_array_equal(kept, [[1, 0, 0], [1, 1, 0], [0, 0, 1]])
    self.assertEqual(kept.dtype, jnp.int32)
    np.testing.assert_allclose(frac, 4 / 8)
    counts = objectives.batch_counts(kept)  # masked tokens leave the aggregation's counts
    self.assertEqual((float(counts["tokens"]), float(counts["sequences"])), (4.0, 3.0))

  def test_sequence_level(self):
    # Geometric means 1, 1.5, 1.754: all kept at [0.5, 2]; at high = 1.6 row 2 goes whole.
    kept, frac = objectives.behaviour_mask(self.old, self.behaviour, self.mask,
                                           _mask_cfg("sequence"))
    np.testing.assert_array_equal(kept, self.mask)
    self.assertEqual(float(frac), 0.0)
    cfg = _mask_cfg("sequence")
    cfg.high = 1.6
    kept, frac = objectives.behaviour_mask(self.old, self.behaviour, self.mask, cfg)
    np.testing.assert_array_equal(kept, [[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(frac, 3 / 8)
    counts = objectives.batch_counts(kept)
    self.assertEqual((float(counts["tokens"]), float(counts["sequences"])), (5.0, 2.0))

  def test_off_returns_the_mask_unchanged(self):
    kept, frac = objectives.behaviour_mask(self.old, self.behaviour, self.mask, _mask_cfg("off"))
    self.assertIs(kept, self.mask)
    self.assertEqual(float(frac), 0.0)

  def test_masked_tokens_get_no_gradient(self):
    # token_mean over the kept tokens only: A = 1, logp = old = -1 (ρ = 1, inside the clip),
    # so ℓ = -ρ and dℓ/dlogp_t = -ρ_t / 4 on the 4 kept tokens, 0 on the masked ones.
    cfg = schema.algo_config(schema.sampling_config())
    cfg.kl.coef, cfg.loss.aggregation = 0.0, "token_mean"
    kept, _ = objectives.behaviour_mask(self.old, self.behaviour, self.mask, _mask_cfg("token"))
    logp = -jnp.ones((3, 3))
    grad = jax.grad(lambda lp: objectives.policy_loss(lp, -jnp.ones((3, 3)), jnp.ones(3), kept,
                                                      cfg)[0])(logp)
    np.testing.assert_allclose(grad, -0.25 * np.asarray(kept, np.float32), atol=1e-7)


if __name__ == "__main__":
  absltest.main()
