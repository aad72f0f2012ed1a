"""Advantage estimators against numbers worked by hand."""
import functools
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.config import schema
from jaxrl_llm import objectives
from jaxrl_llm.objectives import advantages


def algo_cfg(**adv_overrides):
  cfg = schema.algo_config(schema.sampling_config())
  cfg.kl.coef = 0.0
  cfg.kl.placement = "none"
  for key, value in adv_overrides.items():
    cfg.advantage[key] = value
  return cfg


class OutcomeAdvantagesTest(parameterized.TestCase):

  def test_grpo_seed_003_example(self):
    # R = [1,0,0,0]: mean 0.25; population std sqrt((0.75² + 3·0.25²)/4) = sqrt(0.1875)
    # = 0.4330; A = [0.75, -0.25, -0.25, -0.25] / 0.4330 = [1.732, -0.577, -0.577, -0.577].
    adv = objectives.outcome_advantages(jnp.array([[1.0, 0, 0, 0]]), algo_cfg())
    np.testing.assert_allclose(adv, [[1.732, -0.577, -0.577, -0.577]], atol=1e-3)
    np.testing.assert_allclose(adv[0, 0], 0.75 / (np.sqrt(0.1875) + 1e-6), rtol=1e-6)

  def test_grpo_unbiased_std(self):
    # ddof 1: std = sqrt((0.5625 + 3·0.0625)/3) = sqrt(0.25) = 0.5 -> [1.5, -0.5, ...].
    adv = objectives.outcome_advantages(jnp.array([[1.0, 0, 0, 0]]), algo_cfg(std_ddof=1))
    np.testing.assert_allclose(adv, [[1.5, -0.5, -0.5, -0.5]], atol=1e-5)

  def test_grpo_batch_scale(self):
    # Means per group [0.5, 1]; centred [[0.5, -0.5], [0, 0]]. Batch std of [1,0,1,1]:
    # mean 0.75, var (3·0.0625 + 0.5625)/4 = 0.1875, std 0.4330 -> ±0.5/0.4330 = ±1.1547.
    adv = objectives.outcome_advantages(
        jnp.array([[1.0, 0.0], [1.0, 1.0]]), algo_cfg(scale="batch"))
    np.testing.assert_allclose(adv, [[1.1547, -1.1547], [0.0, 0.0]], atol=1e-4)

  def test_grpo_scale_none_is_dr_grpo(self):
    rewards = jnp.array([[1.0, 0, 0, 0], [0.2, 0.4, 0.9, 0.1]])
    np.testing.assert_allclose(
        objectives.outcome_advantages(rewards, algo_cfg(scale="none")),
        objectives.outcome_advantages(rewards, algo_cfg(estimator="dr_grpo")))

  def test_dr_grpo_seed_002(self):
    # R - mean: [0.75, -0.25, -0.25, -0.25] (seed 002's +0.75 / -0.25).
    adv = objectives.outcome_advantages(jnp.array([[1.0, 0, 0, 0]]),
                                        algo_cfg(estimator="dr_grpo"))
    np.testing.assert_allclose(adv, [[0.75, -0.25, -0.25, -0.25]], atol=1e-6)

  def test_rloo(self):
    # [1,0,0,0]: 1 - mean(0,0,0) = 1; 0 - mean(1,0,0) = -1/3.
    # [3,1,2]: 3 - 1.5 = 1.5; 1 - 2.5 = -1.5; 2 - 2 = 0.
    cfg = algo_cfg(estimator="rloo")
    np.testing.assert_allclose(objectives.outcome_advantages(jnp.array([[1.0, 0, 0, 0]]), cfg),
                               [[1.0, -1 / 3, -1 / 3, -1 / 3]], atol=1e-6)
    np.testing.assert_allclose(objectives.outcome_advantages(jnp.array([[3.0, 1, 2]]), cfg),
                               [[1.5, -1.5, 0.0]], atol=1e-6)

  def test_max_rl(self):
    # [1,0,0,0]: (R - 0.25)/0.25 = [3, -1, -1, -1] (seed 002: "+3 / -1").
    # [1,1,0,0]: (R - 0.5)/0.5 = [1, 1, -1, -1]. [0,0,0,0]: mean 0 -> 0.
    adv = objectives.outcome_advantages(
        jnp.array([[1.0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]), algo_cfg(estimator="max_rl"))
    np.testing.assert_allclose(adv, [[3, -1, -1, -1], [1, 1, -1, -1], [0, 0, 0, 0]], atol=1e-6)

  def test_reinforce_pp_baseline_token_weighted(self):
    # Centred [[0.5, -0.5], [0, 0]].
    # Unweighted: mean 0, std sqrt(0.5/4) = 0.35355 -> [1.41421, -1.41421, 0, 0].
    # Lengths [1, 3, 2, 2] (8 tokens): mean (0.5 - 1.5)/8 = -0.125;
    # var (1·0.625² + 3·0.375² + 4·0.125²)/8 = 0.875/8 = 0.109375, std 0.330719;
    # A = [0.625, -0.375, 0.125, 0.125] / 0.330719 = [1.88982, -1.13389, 0.37796, 0.37796].
    rewards = jnp.array([[1.0, 0.0], [0.0, 0.0]])
    cfg = algo_cfg(estimator="reinforce_pp_baseline")
    np.testing.assert_allclose(objectives.outcome_advantages(rewards, cfg),
                               [[1.41421, -1.41421], [0, 0]], atol=1e-4)
    lengths = jnp.array([[1.0, 3.0], [2.0, 2.0]])
    np.testing.assert_allclose(
        objectives.outcome_advantages(rewards, cfg, lengths_PG=lengths),
        [[1.88982, -1.13389], [0.37796, 0.37796]], atol=1e-4)

  def test_constant(self):
    adv = objectives.outcome_advantages(jnp.array([[0.3], [-2.0]]), algo_cfg(estimator="constant"))
    np.testing.assert_array_equal(adv, [[1.0], [1.0]])

  @parameterized.parameters("grpo", "dr_grpo", "rloo", "max_rl", "reinforce_pp_baseline")
  def test_zero_variance_groups_give_zero_and_no_nan(self, estimator):
    # Group 0 carries signal; groups 1-3 are constant (0.3 is not exactly representable,
    # so a naive R - mean would leave rounding noise).
    rewards = jnp.array([[1.0, 0, 0, 1], [0.3, 0.3, 0.3, 0.3], [0, 0, 0, 0], [1, 1, 1, 1]])
    for eps in (1e-6, 0.0):
      adv = objectives.outcome_advantages(rewards, algo_cfg(estimator=estimator, eps=eps))
      self.assertTrue(np.all(np.isfinite(adv)))
      if estimator != "reinforce_pp_baseline":  # batch-normalised: zero only before whitening
        np.testing.assert_array_equal(adv[1:], 0.0)
      self.assertGreater(float(jnp.abs(adv[0]).sum()), 0.0)
    np.testing.assert_allclose(objectives.zero_variance_group_frac(rewards), 0.75)

  def test_reinforce_pp_baseline_zero_variance_is_shifted_not_nan(self):
    # All groups constant: everything is 0 after centring, whitening keeps 0.
    adv = objectives.outcome_advantages(
        jnp.full((3, 4), 0.3), algo_cfg(estimator="reinforce_pp_baseline"))
    np.testing.assert_array_equal(adv, 0.0)

  @parameterized.parameters((3.0, 1.0), (0.5, -2.0), (100.0, 7.0))
  def test_grpo_invariant_to_positive_affine_rewards(self, a, b):
    rewards = jax.random.uniform(jax.random.PRNGKey(0), (5, 8))
    cfg = algo_cfg(eps=1e-8)
    adv = objectives.outcome_advantages(rewards, cfg)
    adv_affine = objectives.outcome_advantages(a * rewards + b, cfg)
    self.assertGreater(float(jnp.abs(a * rewards + b - rewards).max()), 0.1)
    np.testing.assert_allclose(adv_affine, adv, atol=1e-4)

  def test_group_estimators_need_two_samples(self):
    for name in ("grpo", "rloo", "dr_grpo", "max_rl"):
      with self.assertRaisesRegex(ValueError, "G >= 2"):
        objectives.outcome_advantages(jnp.ones((3, 1)), algo_cfg(estimator=name))

  def test_token_estimators_refuse_outcome_call(self):
    with self.assertRaisesRegex(ValueError, "token_advantages"):
      objectives.outcome_advantages(jnp.ones((2, 2)), algo_cfg(estimator="gae"))

  def test_unknown_estimator_names_valid_ones(self):
    with self.assertRaisesRegex(ValueError, "valid: .*'grpo'.*'rloo'"):
      objectives.outcome_advantages(jnp.ones((2, 2)), algo_cfg(estimator="grpoo"))

  def test_user_function_by_file_path(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "my_adv.py")
      with open(path, "w") as f:
        f.write("def double(rewards, cfg):\n  return 2.0 * rewards\n")
      cfg = algo_cfg(fn=f"{path}:double")
      adv = objectives.outcome_advantages(jnp.array([[1.0, 2.0]]), cfg)
    np.testing.assert_allclose(adv, [[2.0, 4.0]])

  def test_jit(self):
    fn = jax.jit(functools.partial(objectives.outcome_advantages, cfg=algo_cfg()))
    np.testing.assert_allclose(fn(jnp.array([[1.0, 0, 0, 0]]))[0, 0], 1.732, atol=1e-3)


class TokenLevelTest(parameterized.TestCase):

  def test_gae_hand_worked(self):
    # γ = 0.9, λ = 0.8, γλ = 0.72.
    # Row 0, all valid, r = [0,0,1], V = [0.5,0.6,0.7]:
    #   t=2: δ = 1 - 0.7 = 0.3                      A = 0.3
    #   t=1: δ = 0.9·0.7 - 0.6 = 0.03               A = 0.03 + 0.72·0.3 = 0.246
    #   t=0: δ = 0.9·0.6 - 0.5 = 0.04               A = 0.04 + 0.72·0.246 = 0.21712
    # Row 1, mask [1,1,0] (V=9 on padding is ignored), r = [0,1,0]:
    #   t=1: δ = 1 - 0.6 = 0.4 (value after the last valid token is 0)   A = 0.4
    #   t=0: δ = 0.04                                A = 0.04 + 0.72·0.4 = 0.328
    # Row 2, a hole: mask [1,0,1], r = [0,5,1] (the 5 is masked):
    #   t=2: A = 0.3; t=0: δ = 0.9·0.7 - 0.5 = 0.13, A = 0.13 + 0.72·0.3 = 0.346
    rewards = jnp.array([[0.0, 0, 1], [0, 1, 0], [0, 5, 1]])
    values = jnp.array([[0.5, 0.6, 0.7], [0.5, 0.6, 9.0], [0.5, 9.0, 0.7]])
    mask = jnp.array([[1.0, 1, 1], [1, 1, 0], [1, 0, 1]])
    adv, ret = objectives.gae(rewards, values, mask, 0.9, 0.8)
    np.testing.assert_allclose(
        adv, [[0.21712, 0.246, 0.3], [0.328, 0.4, 0], [0.346, 0, 0.3]], atol=1e-6)
    np.testing.assert_allclose(
        ret, [[0.71712, 0.846, 1.0], [0.828, 1.0, 0], [0.846, 0, 1.0]], atol=1e-6)

  def test_gae_lambda_one_gamma_one_is_return_minus_value(self):
    rewards = jax.random.normal(jax.random.PRNGKey(1), (2, 5))
    values = jax.random.normal(jax.random.PRNGKey(2), (2, 5))
    mask = jnp.ones((2, 5))
    adv, _ = objectives.gae(rewards, values, mask, 1.0, 1.0)
    returns = jnp.flip(jnp.cumsum(jnp.flip(rewards, 1), 1), 1)
    np.testing.assert_allclose(adv, returns - values, atol=1e-5)

  def test_discounted_returns(self):
    # γ = 0.5, r = [0, 0, 1] -> [0.25, 0.5, 1]; masked tail stays 0.
    ret = objectives.discounted_returns(jnp.array([[0.0, 0, 1, 0]]), jnp.array([[1.0, 1, 1, 0]]),
                                        0.5)
    np.testing.assert_allclose(ret, [[0.25, 0.5, 1.0, 0.0]])

  def test_outcome_token_rewards_on_last_valid_token(self):
    mask = jnp.array([[1.0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(
        objectives.outcome_token_rewards(jnp.array([2.0, 3.0, 4.0]), mask),
        [[0, 0, 2, 0], [3, 0, 0, 0], [0, 0, 0, 0]])

  def test_token_rewards_with_kl(self):
    # R = [2, 3] on the last valid token, minus β·kl = 0.5·[[0.2, 0.4, ·], [0.6, ·, ·]]:
    # [[-0.1, 2 - 0.2, 0], [3 - 0.3, 0, 0]]; summed per response: [2 - 0.3, 3 - 0.3].
    mask = jnp.array([[1.0, 1, 0], [1, 0, 0]])
    kl = jnp.array([[0.2, 0.4, 9.0], [0.6, 9.0, 9.0]])
    np.testing.assert_allclose(
        objectives.outcome_token_rewards(jnp.array([2.0, 3.0]), mask, kl_BT=kl, kl_coef=0.5),
        [[-0.1, 1.8, 0.0], [2.7, 0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(
        objectives.kl_penalised_rewards(jnp.array([2.0, 3.0]), mask, kl, 0.5), [1.7, 2.7],
        atol=1e-6)

  def test_reinforce_pp_with_kl_in_reward(self):
    # P=1, G=2, mask [[1,1],[1,0]], R = [1, 0], k1 = logp - ref = [[0.1,0.2],[0.3,·]],
    # β = 0.5, γ = 1. Token rewards: [[-0.05, 1 - 0.1], [-0.15, 0]]
    # returns [[0.85, 0.9], [-0.15, 0]]; over the 3 valid tokens mean 0.53333,
    # std 0.483621 -> [0.654782, 0.758169, -1.412950].
    cfg = algo_cfg(estimator="reinforce_pp", gamma=1.0)
    cfg.kl.coef, cfg.kl.estimator, cfg.kl.placement = 0.5, "k1", "reward"
    logp = jnp.array([[-1.0, -1.0], [-1.0, -1.0]])
    ref = logp - jnp.array([[0.1, 0.2], [0.3, 0.0]])
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    adv, ret = objectives.token_advantages(jnp.array([[1.0, 0.0]]), mask, cfg,
                                           logp_BT=logp, ref_logp_BT=ref)
    self.assertIsNone(ret)
    np.testing.assert_allclose(adv, [[0.654782, 0.758169], [-1.412950, 0.0]], atol=1e-5)

  def test_rloo_with_kl_in_reward(self):
    # Same data: R' = R - β·Σ_t k1 = [1 - 0.5·0.3, 0 - 0.5·0.3] = [0.85, -0.15];
    # leave-one-out with G = 2: [0.85 + 0.15, -0.15 - 0.85] = [1, -1], on valid tokens.
    cfg = algo_cfg(estimator="rloo")
    cfg.kl.coef, cfg.kl.estimator, cfg.kl.placement = 0.5, "k1", "reward"
    logp = jnp.full((2, 2), -1.0)
    ref = logp - jnp.array([[0.1, 0.2], [0.3, 0.0]])
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    adv, _ = objectives.token_advantages(jnp.array([[1.0, 0.0]]), mask, cfg,
                                         logp_BT=logp, ref_logp_BT=ref)
    np.testing.assert_allclose(adv, [[1.0, 1.0], [-1.0, 0.0]], atol=1e-6)

  def test_token_advantages_gae_matches_gae(self):
    cfg = algo_cfg(estimator="gae", gamma=0.9, lam=0.8)
    mask = jnp.array([[1.0, 1, 1], [1, 1, 0]])
    values = jnp.array([[0.5, 0.6, 0.7], [0.5, 0.6, 9.0]])
    adv, ret = objectives.token_advantages(jnp.array([[1.0], [1.0]]), mask, cfg, values_BT=values)
    # Outcome 1 on the last valid token = row rewards [0,0,1] and [0,1,0] of the GAE test.
    np.testing.assert_allclose(adv, [[0.21712, 0.246, 0.3], [0.328, 0.4, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0.71712, 0.846, 1.0], [0.828, 1.0, 0]], atol=1e-6)
    cfg.advantage.whiten = True
    white, _ = objectives.token_advantages(jnp.array([[1.0], [1.0]]), mask, cfg, values_BT=values)
    valid = np.asarray(white)[np.asarray(mask) > 0]
    np.testing.assert_allclose([valid.mean(), valid.std()], [0.0, 1.0], atol=1e-4)

  def test_gae_credits_each_turns_reward_where_it_sits(self):
    # An episode of two model turns (tokens 0-1 and 3-4; token 2 is the environment's,
    # masked): step rewards 0.5 after turn 1 and 0.25 after turn 2, outcome 1.0, so
    # R = 1.75; V = 0, gamma = 0.5, lambda = 1 (GAE skips the masked token).
    # Token rewards [0, 0.5, -, 0, 0.25 + 1.0]: A_4 = 1.25, A_3 = 0.5 * 1.25 = 0.625,
    # A_1 = 0.5 + 0.5 * 0.625 = 0.8125, A_0 = 0.5 * 0.8125 = 0.40625. Without the turn
    # rewards all of R sits on the last token: [0.21875, 0.4375, 0, 0.875, 1.75].
    cfg = algo_cfg(estimator="gae", gamma=0.5, lam=1.0)
    mask = jnp.array([[1.0, 1, 0, 1, 1]])
    turn = jnp.array([[0.0, 0.5, 0, 0, 0.25]])
    values = jnp.zeros((1, 5))
    adv, ret = objectives.token_advantages(jnp.array([[1.75]]), mask, cfg, values_BT=values,
                                           turn_rewards_BT=turn)
    np.testing.assert_allclose(adv, [[0.40625, 0.8125, 0, 0.625, 1.25]], atol=1e-6)
    np.testing.assert_allclose(ret, adv, atol=1e-6)
    flat, _ = objectives.token_advantages(jnp.array([[1.75]]), mask, cfg, values_BT=values)
    np.testing.assert_allclose(flat, [[0.21875, 0.4375, 0, 0.875, 1.75]], atol=1e-6)
    # Outcome estimators read only R: the turn rewards change nothing there.
    grpo = algo_cfg(estimator="grpo")
    rewards = jnp.array([[1.75, 0.0]])
    mask2 = jnp.concatenate([mask, mask])
    np.testing.assert_allclose(
        objectives.token_advantages(rewards, mask2, grpo, turn_rewards_BT=jnp.concatenate(
            [turn, turn]))[0], objectives.token_advantages(rewards, mask2, grpo)[0])

  def test_token_advantages_broadcasts_outcome_estimators(self):
    mask = jnp.array([[1.0, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    adv, _ = objectives.token_advantages(jnp.array([[1.0, 0], [0, 1]]), mask,
                                         algo_cfg(estimator="dr_grpo"))
    np.testing.assert_allclose(adv, [[0.5, 0.5, 0], [-0.5, 0, 0], [-0.5, -0.5, -0.5], [0, 0, 0]])

  def test_masked_whiten(self):
    # Valid [1, 2, 3]: mean 2, std sqrt(2/3) = 0.816497 -> [-1.224745, 0, 1.224745].
    x = jnp.array([[1.0, 2.0, 100.0], [3.0, -50.0, -50.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    np.testing.assert_allclose(advantages.masked_whiten(x, mask, 0.0),
                               [[-1.224745, 0, 0], [1.224745, 0, 0]], atol=1e-5)

  def test_outputs_are_stop_gradient(self):
    def f(r):  # weighted: a plain sum of centred advantages is 0 anyway
      return jnp.sum(objectives.outcome_advantages(r, algo_cfg()) * jnp.arange(1.0, 5.0)[None, :])
    chex.assert_trees_all_close(jax.grad(f)(jnp.array([[1.0, 0, 2, 0]])), jnp.zeros((1, 4)))


class RaeTest(absltest.TestCase):
  """SPIRAL's role-conditioned baselines: each row against its key's baseline before its own
  reward updates it, b <- 0.95 b + 0.05 r."""

  def test_order_and_keys(self):
    rewards = jnp.array([1.0, 0.0, 1.0, 1.0])
    keys = jnp.array([0, 0, 1, 0])
    seen, after = objectives.rae_baselines(rewards, keys, jnp.array([0.0, 0.5]), 0.95)
    # key 0: 0 -> (scores row 0 against 0) 0.05 -> (row 1 against 0.05) 0.0475 -> (row 3) 0.095125
    # key 1: 0.5 -> (row 2 against 0.5) 0.525
    np.testing.assert_allclose(seen, [0.0, 0.05, 0.5, 0.0475], rtol=1e-6)
    np.testing.assert_allclose(after, [0.0475 * 0.95 + 0.05, 0.525], rtol=1e-6)

  def test_advantage_is_reward_minus_the_seen_baseline(self):
    cfg = schema.algo_config(schema.sampling_config())
    cfg.advantage.estimator = "rae"
    cfg.kl.placement = "none"
    rewards = jnp.array([[1.0, 0.0, 1.0]])  # any group size, one group here
    seen, _ = objectives.rae_baselines(rewards.reshape(-1), jnp.zeros(3, jnp.int32),
                                       jnp.zeros(1), 0.95)
    adv, _ = objectives.token_advantages(rewards, jnp.ones((3, 2)), cfg, baselines_B=seen)
    np.testing.assert_allclose(adv[:, 0], [1.0, -0.05, 1.0 - 0.0475], rtol=1e-6)
    with self.assertRaisesRegex(ValueError, "baselines_B"):
      objectives.token_advantages(rewards, jnp.ones((3, 2)), cfg)


if __name__ == "__main__":
  absltest.main()
