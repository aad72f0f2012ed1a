"""Policy and value losses: hand-worked values and gradients for every axis."""
import functools
import importlib
import math
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.config import schema
from jaxrl_llm import objectives

PRESETS = ("ppo", "grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "cispo", "gmpo",
           "sapo", "max_rl", "sft")


def preset_algo(name, **sampling):
  config = importlib.import_module(f"configs.{name}").get_config()
  for key, value in sampling.items():
    config.sampling[key] = value
  return config.algo


def algo(ratio="token", trust_region="clip", aggregation="token_mean", **loss):
  cfg = schema.algo_config(schema.sampling_config())
  cfg.kl.coef, cfg.kl.placement = 0.0, "none"
  cfg.loss.ratio, cfg.loss.trust_region, cfg.loss.aggregation = ratio, trust_region, aggregation
  for key, value in loss.items():
    cfg.loss[key] = value
  return cfg


def loss_and_grad(cfg, logp, old_logp, adv, mask, **kw):
  """(loss, d loss / d logp, metrics) of policy_loss under jit."""
  fn = functools.partial(objectives.policy_loss, cfg=cfg, **kw)
  (loss, metrics), grad = jax.jit(jax.value_and_grad(fn, has_aux=True))(
      logp, old_logp, adv, mask)
  return float(loss), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


def tokens_with_ratios(ratios, logp=-1.0):
  """[1, T] logp and old_logp whose ratios exp(logp - old) are `ratios`."""
  logp_BT = jnp.full((1, len(ratios)), logp)
  return logp_BT, logp_BT - jnp.log(jnp.array(ratios))[None, :]


class SeedExamplesTest(parameterized.TestCase):

  def test_seed_003_clip_example(self):
    # A = 1.732, clip 0.2. ρ = 1.10: objective 1.10·1.732 = 1.905, gradient active
    # (d(-ρA)/dlogp = -ρA = -1.905). ρ = 1.25: clipped at 1.2·1.732 = 2.078, no gradient.
    cfg = preset_algo("grpo")
    cfg.kl.coef = 0.0
    for rho, objective, grad in ((1.10, 1.905, -1.905), (1.25, 2.078, 0.0)):
      logp, old = tokens_with_ratios([rho])
      loss, g, _ = loss_and_grad(cfg, logp, old, jnp.array([1.732]), jnp.ones((1, 1)))
      np.testing.assert_allclose(loss, -objective, atol=1e-3)
      np.testing.assert_allclose(g, [[grad]], atol=1e-3)

  @parameterized.named_parameters(
      # Seed 002: R = (1,0,0,0), success 200 tokens, failures 800, limit 1,000.
      # GRPO: A ±(1.732, 0.577), weight A/(4·L): 1.732/800 = 2.2e-3, 0.577/3200 = 1.8e-4.
      ("grpo", "grpo", (1.732 / 800, 0.5774 / 3200), (2.2e-3, 1.8e-4)),
      # DAPO: A/2600 (200 + 3·800 tokens): 6.7e-4, 2.2e-4.
      ("dapo", "dapo", (1.732 / 2600, 0.5774 / 2600), (6.7e-4, 2.2e-4)),
      # Dr. GRPO: A = ±(0.75, 0.25), weight A/(4·1000): 1.9e-4, 6.3e-5.
      ("dr_grpo", "dr_grpo", (0.75 / 4000, 0.25 / 4000), (1.9e-4, 6.3e-5)),
  )
  def test_seed_002_per_token_weights(self, preset, exact, seed_rounded):
    cfg = preset_algo(preset, max_new_tokens=1000)  # Dr. GRPO's norm_length follows it
    lengths = jnp.array([200, 800, 800, 800])
    mask = (jnp.arange(1000)[None, :] < lengths[:, None]).astype(jnp.float32)
    adv = objectives.outcome_advantages(jnp.array([[1.0, 0, 0, 0]]), cfg).reshape(4)
    logp = jnp.full((4, 1000), -0.5)  # on-policy: ratio 1
    _, g, _ = loss_and_grad(cfg, logp, logp, adv, mask, ref_logp=logp)
    weight_success, weight_failure = -g[0, 0], g[1, 0]  # objective weights, sign flipped
    np.testing.assert_allclose([weight_success, weight_failure], exact, rtol=1e-3)
    np.testing.assert_allclose([weight_success, weight_failure], seed_rounded, rtol=0.05)
    # Every valid token of a response has the same weight; padding has none.
    np.testing.assert_allclose(g[0, :200], g[0, 0], rtol=1e-6)
    np.testing.assert_array_equal(g[0, 200:], 0.0)


class TrustRegionTest(parameterized.TestCase):

  def test_clip_hand_worked(self):
    # clip 0.2/0.2, token_mean over 4 tokens (each weight 1/4):
    #   A=+1, ρ=0.5: -min(0.5, 0.8) = -0.5   grad -ρA = -0.5  (unclipped side)
    #   A=+1, ρ=1.5: -min(1.5, 1.2) = -1.2   grad 0           (clipped high)
    #   A=-1, ρ=0.5: -min(-0.5,-0.8) = 0.8   grad 0           (clipped low)
    #   A=-1, ρ=1.5: -min(-1.5,-1.2) = 1.5   grad +1.5        (pessimistic, unclipped)
    # loss = (-0.5 - 1.2 + 0.8 + 1.5)/4 = 0.15.
    logp, old = tokens_with_ratios([0.5, 1.5, 0.5, 1.5])
    adv = jnp.array([[1.0, 1.0, -1.0, -1.0]])
    loss, g, m = loss_and_grad(algo(), logp, old, adv, jnp.ones((1, 4)))
    np.testing.assert_allclose(loss, 0.15, atol=1e-6)
    np.testing.assert_allclose(g, [[-0.5 / 4, 0.0, 0.0, 1.5 / 4]], atol=1e-6)
    self.assertEqual((m["clip_frac_low"], m["clip_frac_high"], m["clip_frac"]), (0.25, 0.25, 0.5))

  def test_clip_higher(self):
    # DAPO 0.2/0.28, A = +1: ρ = 1.25 < 1.28 is not clipped (loss -1.25, grad -1.25);
    # ρ = 1.30 is (loss -1.28, grad 0). ρ = 0.75 with A = -1: below 0.8 -> clipped.
    logp, old = tokens_with_ratios([1.25, 1.30, 0.75])
    loss, g, _ = loss_and_grad(algo(clip_high=0.28), logp, old, jnp.array([[1.0, 1.0, -1.0]]),
                               jnp.ones((1, 3)))
    np.testing.assert_allclose(loss, (-1.25 - 1.28 + 0.8) / 3, atol=1e-6)
    np.testing.assert_allclose(g, [[-1.25 / 3, 0.0, 0.0]], atol=1e-6)

  def test_dual_clip(self):
    # c = 3, A = -1: ρ = 5: -min(-5, -1.2) = 5, bounded by -c·A = 3 -> 3, grad 0.
    # ρ = 2: loss 2 < 3 stays, grad 2. Token mean over 2.
    logp, old = tokens_with_ratios([5.0, 2.0])
    loss, g, m = loss_and_grad(algo(dual_clip=3.0), logp, old, jnp.array([[-1.0, -1.0]]),
                               jnp.ones((1, 2)))
    np.testing.assert_allclose(loss, (3.0 + 2.0) / 2, atol=1e-5)
    np.testing.assert_allclose(g, [[0.0, 1.0]], atol=1e-5)
    self.assertEqual(m["clip_frac_dual"], 0.5)

  def test_cispo_keeps_gradient_of_truncated_tokens(self):
    # cispo, clip_high 3 (weight cap 4), no lower bound, logp = -1, A = +1:
    #   ρ = 5   -> w = sg(4):   loss -4·1·(-1) = 4,    grad -4    (clip would give 0)
    #   ρ = 0.5 -> w = sg(0.5): loss -0.5·(-1) = 0.5, grad -0.5
    cfg = preset_algo("cispo")
    logp, old = tokens_with_ratios([5.0, 0.5])
    loss, g, m = loss_and_grad(cfg, logp, old, jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)))
    np.testing.assert_allclose(loss, (4.0 + 0.5) / 2, atol=1e-5)
    np.testing.assert_allclose(g, [[-4.0 / 2, -0.5 / 2]], atol=1e-5)
    self.assertEqual(m["clip_frac"], 0.5)
    self.assertNotIn("clip_frac_low", m)
    # With a lower bound (clip_low 0.2): ρ = 0.5 gets w = 0.8.
    cfg.loss.clip_low = 0.2
    _, g, m = loss_and_grad(cfg, logp, old, jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)))
    np.testing.assert_allclose(g, [[-4.0 / 2, -0.8 / 2]], atol=1e-5)
    self.assertEqual((m["clip_frac_low"], m["clip_frac_high"]), (0.5, 0.5))
    # Whereas the PPO clip silences the truncated token entirely.
    _, g_clip, _ = loss_and_grad(algo(), logp, old, jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)))
    self.assertEqual(g_clip[0, 0], 0.0)

  def test_gmpo_hand_worked(self):
    # clip ±0.4 in log space, one response of 2 tokens, mean over responses.
    # A = +1, log ρ = [0.6, -0.2]: clipped [0.4, -0.2], pessimistic (min) [0.4, -0.2],
    #   mean 0.1 -> loss -exp(0.1) = -1.105171; grad: token 0 clipped -> 0,
    #   token 1: -exp(0.1)/2 = -0.552585.
    # A = -1, log ρ = [0.6, -0.6]: clipped [0.4, -0.4], pessimistic (max) [0.6, -0.4],
    #   mean 0.1 -> loss +1.105171; grad: token 0 +0.552585, token 1 clipped -> 0.
    cfg = preset_algo("gmpo")
    e = math.exp(0.1)
    for adv, log_ratio, want_loss, want_grad, frac in (
        (1.0, [0.6, -0.2], -e, [0.0, -e / 2], ("clip_frac_high", 0.5)),
        (-1.0, [0.6, -0.6], e, [e / 2, 0.0], ("clip_frac_low", 0.5))):
      logp, old = tokens_with_ratios(list(np.exp(log_ratio)))
      loss, g, m = loss_and_grad(cfg, logp, old, jnp.array([adv]), jnp.ones((1, 2)))
      np.testing.assert_allclose(loss, want_loss, atol=1e-5)
      np.testing.assert_allclose(g, [want_grad], atol=1e-5)
      self.assertAlmostEqual(m[frac[0]], frac[1])

  def test_gmpo_is_mean_over_responses(self):
    # Two responses of lengths 1 and 3, on-policy: terms -A_b·exp(0) = -A_b each;
    # mean over responses (not tokens): -(2 + (-1))/2 = -0.5.
    logp = jnp.full((2, 3), -1.0)
    mask = jnp.array([[1.0, 0, 0], [1, 1, 1]])
    loss, _, _ = loss_and_grad(preset_algo("gmpo"), logp, logp, jnp.array([2.0, -1.0]), mask)
    np.testing.assert_allclose(loss, -0.5, atol=1e-6)

  def test_sapo_hand_worked(self):
    # f(ρ) = σ(τ(ρ-1))·4/τ; grad wrt logp = -A·4σ(1-σ)·ρ.
    #   A=+1, τ=1,    ρ=1:   f = 0.5·4 = 2,               grad -1
    #   A=+1, τ=1,    ρ=1.5: σ(0.5) = 0.622459, f = 2.489837, grad -4·0.622459·0.377541·1.5 = -1.410022
    #   A=-1, τ=1.05, ρ=1.5: σ(0.525) = 0.628316, f = 2.393585, grad +1.401210
    # token_mean over 3 tokens.
    logp, old = tokens_with_ratios([1.0, 1.5, 1.5])
    cfg = algo(trust_region="sapo", tau_pos=1.0, tau_neg=1.05)
    loss, g, _ = loss_and_grad(cfg, logp, old, jnp.array([[1.0, 1.0, -1.0]]), jnp.ones((1, 3)))
    np.testing.assert_allclose(loss, (-2.0 - 2.489837 + 2.393585) / 3, atol=1e-5)
    np.testing.assert_allclose(g, [[-1.0 / 3, -1.410022 / 3, 1.401210 / 3]], atol=1e-5)
    # Faster decay for negative advantages: |grad| at ρ = 1.5 is smaller for A < 0.
    self.assertLess(abs(g[0, 2]), abs(g[0, 1]))

  def test_no_trust_region(self):
    # -ρ·A: ρ = 2, A = 0.5 -> -1, grad -ρA = -1.
    logp, old = tokens_with_ratios([2.0])
    loss, g, _ = loss_and_grad(algo(trust_region="none"), logp, old, jnp.array([0.5]),
                               jnp.ones((1, 1)))
    np.testing.assert_allclose([loss, g[0, 0]], [-1.0, -1.0], atol=1e-6)

  def test_ratio_none_is_reinforce(self):
    # rloo: -A·logp summed per response, mean over responses; old_logp is ignored.
    # Response 0: -(2)·(-1 - 2) = 6; response 1: -(-1)·(-0.5) = -0.5 -> mean 2.75.
    logp = jnp.array([[-1.0, -2.0], [-0.5, -9.0]])
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    loss, g, _ = loss_and_grad(preset_algo("rloo"), logp, logp + 3.0, jnp.array([2.0, -1.0]),
                               mask)
    np.testing.assert_allclose(loss, 2.75, atol=1e-6)
    np.testing.assert_allclose(g, [[-1.0, -1.0], [0.5, 0.0]], atol=1e-6)

  def test_sft_is_token_mean_nll(self):
    logp = -jax.random.uniform(jax.random.PRNGKey(0), (3, 5))
    mask = jnp.array([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    cfg = preset_algo("sft")
    adv = objectives.outcome_advantages(jnp.zeros((3, 1)), cfg).reshape(3)
    loss, _, _ = loss_and_grad(cfg, logp, logp, adv, mask)
    np.testing.assert_allclose(loss, -float(jnp.sum(logp * mask) / jnp.sum(mask)), rtol=1e-6)


class RatioTest(parameterized.TestCase):

  def test_sequence_vs_sequence_token_gradients(self):
    # One response, log ρ = [0.2, 0.0] -> s = exp(0.1) = 1.105171; token advantages
    # A = [1, 3]; trust region none; seq_mean_token_mean (N = 1, L = 2).
    # Both: loss = (1/2)·(-s·1 - s·3) = -2s = -2.210342.
    # sequence:       d/dlogp_t = -(1/2)·(A_0 + A_1)·s/2 = -s = -1.105171 for both tokens.
    # sequence_token: d/dlogp_t = -(1/2)·A_t·s = [-0.552585, -1.657756] (sg on s_b).
    s = math.exp(0.1)
    logp, old = tokens_with_ratios([math.exp(0.2), 1.0])
    adv = jnp.array([[1.0, 3.0]])
    for ratio, want in (("sequence", [-s, -s]), ("sequence_token", [-s / 2, -3 * s / 2])):
      cfg = algo(ratio=ratio, trust_region="none", aggregation="seq_mean_token_mean")
      loss, g, m = loss_and_grad(cfg, logp, old, adv, jnp.ones((1, 2)))
      np.testing.assert_allclose(loss, -2 * s, rtol=1e-6)
      np.testing.assert_allclose(g, [want], rtol=1e-5)
      np.testing.assert_allclose([m["ratio_min"], m["ratio_max"]], [s, s], rtol=1e-6)

  def test_sequence_clip_gspo(self):
    # GSPO clip 3e-4/4e-4: log ρ = [0.001, 0.001] -> s = e^0.001 = 1.0010005 > 1.0004,
    # A > 0: clipped, every token has zero gradient; loss -1.0004·A.
    logp, old = tokens_with_ratios([math.exp(0.001)] * 2)
    loss, g, m = loss_and_grad(preset_algo("gspo"), logp, old, jnp.array([1.0]),
                               jnp.ones((1, 2)))
    np.testing.assert_allclose(loss, -1.0004, rtol=1e-6)
    np.testing.assert_array_equal(g, 0.0)
    self.assertEqual(m["clip_frac_high"], 1.0)


class AtRatioOneTest(parameterized.TestCase):
  """At ρ = 1 every preset's gradient wrt logp is -A × its aggregation weight."""

  # Lengths [3, 1, 2, 2]: 8 tokens, 4 sequences. Per-token weight w[b,t]/D:
  WEIGHTS = {
      "token_mean": [1 / 8] * 4,
      "seq_mean_token_mean": [1 / 12, 1 / 4, 1 / 8, 1 / 8],  # 1/(4·L_b)
      "seq_mean_token_sum": [1 / 4] * 4,
      "seq_mean_token_sum_norm": [1 / 256] * 4,  # 1/(4·64), norm_length = 64
  }

  @parameterized.parameters(*PRESETS)
  def test_gradient_is_advantage_times_normaliser(self, preset):
    cfg = preset_algo(preset)
    mask = jnp.array([[1.0, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]])
    adv = jnp.array([1.5, -2.0, 0.5, -0.25])
    logp = -jax.random.uniform(jax.random.PRNGKey(3), (4, 3))
    # ref = logp: the KL terms vanish and so do their gradients (k3' = 1 - e^0 = 0).
    _, g, m = loss_and_grad(cfg, logp, logp, adv, mask, ref_logp=logp)
    weight_B = np.array(self.WEIGHTS[cfg.loss.aggregation])
    want = -np.asarray(adv)[:, None] * weight_B[:, None] * np.asarray(mask)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-8)
    self.assertEqual(m["ratio_mean"], 1.0)
    self.assertEqual(m["approx_kl"], 0.0)


class KlAndEntropyTest(parameterized.TestCase):

  def test_kl_estimators(self):
    # u = logp - ref = 0.5: k1 = 0.5, k2 = 0.125, k3 = e^-0.5 + 0.5 - 1 = 0.106531.
    logp, ref = jnp.array([-1.0]), jnp.array([-1.5])
    for est, want in (("k1", 0.5), ("k2", 0.125), ("k3", 0.106531)):
      np.testing.assert_allclose(objectives.kl_divergence(logp, ref, est), [want], atol=1e-6)
    with self.assertRaisesRegex(ValueError, "valid: .*'k3'"):
      objectives.kl_divergence(logp, ref, "k4")

  def test_kl_gradients_and_stop_gradient_on_ref(self):
    # d k3/d logp = 1 - exp(ref - logp) = 1 - e^-0.5 = 0.393469; d/d ref = 0 (data).
    g_logp, g_ref = jax.grad(lambda a, b: objectives.kl_divergence(a, b, "k3").sum(),
                             argnums=(0, 1))(jnp.array([-1.0]), jnp.array([-1.5]))
    np.testing.assert_allclose(g_logp, [0.393469], atol=1e-6)
    np.testing.assert_array_equal(g_ref, [0.0])

  def test_grpo_kl_in_loss(self):
    # grpo: β = 0.04, k3. One token on-policy, A = 0, logp = -1, ref = -1.5:
    # kl_loss = 0.04·0.106531 = 0.00426123; grad = 0.04·(1 - e^-0.5) = 0.01573877.
    logp = jnp.array([[-1.0]])
    loss, g, m = loss_and_grad(preset_algo("grpo"), logp, logp, jnp.array([0.0]),
                               jnp.ones((1, 1)), ref_logp=jnp.array([[-1.5]]))
    np.testing.assert_allclose([loss, m["kl_loss"], g[0, 0]], [0.00426123, 0.00426123, 0.01573877],
                               atol=1e-7)
    np.testing.assert_allclose(m["kl_ref"], 0.106531, atol=1e-6)
    with self.assertWarnsRegex(UserWarning, "no ref_logp: the KL term is left out"):
      loss, m = objectives.policy_loss(logp, logp, jnp.array([0.0]), jnp.ones((1, 1)),
                                       preset_algo("grpo"))
    self.assertEqual((float(loss), float(m["kl_loss"])), (0.0, 0.0))

  def test_entropy_bonus_and_metrics(self):
    # entropy_coef 0.01, H = [2, 1], token_mean: entropy_loss = -0.01·1.5 = -0.015.
    # log ρ = [0.1, 0]: approx_kl = mean(e^0.1 - 0.1 - 1, 0) = 0.0051709/2.
    logp, old = tokens_with_ratios([math.exp(0.1), 1.0])
    cfg = algo(entropy_coef=0.01)
    loss, _, m = loss_and_grad(cfg, logp, old, jnp.array([0.0]), jnp.ones((1, 2)),
                               entropy=jnp.array([[2.0, 1.0]]))
    np.testing.assert_allclose([loss, m["entropy_loss"], m["entropy"]], [-0.015, -0.015, 1.5],
                               atol=1e-7)
    np.testing.assert_allclose(m["approx_kl"], 0.0051709 / 2, atol=1e-7)
    np.testing.assert_allclose([m["ratio_mean"], m["ratio_min"], m["ratio_max"]],
                               [(math.exp(0.1) + 1) / 2, 1.0, math.exp(0.1)], rtol=1e-6)
    np.testing.assert_allclose(m["pg_loss"] + m["kl_loss"] + m["entropy_loss"], loss, rtol=1e-6)


class RobustnessTest(parameterized.TestCase):

  # One preset per ratio / trust region / aggregation kind.
  @parameterized.parameters("grpo", "dr_grpo", "gspo", "rloo", "cispo", "gmpo", "sapo", "sft")
  def test_padding_garbage_changes_nothing(self, preset):
    cfg = preset_algo(preset)
    key = jax.random.PRNGKey(4)
    logp = -jax.random.uniform(key, (4, 5))
    old = logp + 0.05 * jax.random.normal(jax.random.fold_in(key, 1), (4, 5))
    mask = jnp.array([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    adv = jnp.array([1.0, -0.5, 0.3, 2.0])
    pad = mask == 0
    junk = lambda x: jnp.where(pad, -jnp.inf, x)  # noqa: E731
    clean = loss_and_grad(cfg, logp, old, adv, mask, ref_logp=old)
    dirty = loss_and_grad(cfg, junk(logp), junk(old), adv, mask, ref_logp=junk(old))
    np.testing.assert_allclose(dirty[0], clean[0], rtol=1e-6)
    np.testing.assert_allclose(dirty[1], clean[1], rtol=1e-6)
    self.assertTrue(np.all(np.isfinite(dirty[1])))

  def test_user_reducer(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "my_reducer.py")
      with open(path, "w") as f:
        f.write("def masked_sum(loss_BT, mask_BT, counts, loss_cfg):\n"
                "  return (loss_BT * mask_BT).sum()\n")
      cfg = algo(reducer=f"{path}:masked_sum")
      logp, old = tokens_with_ratios([1.0, 1.0])
      loss, _, _ = loss_and_grad(cfg, logp, old, jnp.array([[1.0, 2.0]]), jnp.ones((1, 2)))
    self.assertEqual(loss, -3.0)  # -Σ ρA with ρ = 1, not divided by anything

  def test_unknown_names(self):
    logp = jnp.zeros((1, 1))
    for field, value, pattern in (("aggregation", "mean", "valid: .*'token_mean'"),
                                  ("trust_region", "clipp", "valid: .*'cispo'"),
                                  ("ratio", "tok", "valid: .*'sequence'")):
      cfg = algo(**{field: value})
      with self.assertRaisesRegex(ValueError, pattern):
        objectives.policy_loss(logp, logp, jnp.ones((1,)), jnp.ones((1, 1)), cfg)


class ValueLossTest(absltest.TestCase):

  def test_hand_worked(self):
    # clip 0.2. Token 0: V 1.5, V_old 1.0, Ret 2.0: (1.5-2)² = 0.25; clipped V 1.2:
    #   (1.2-2)² = 0.64 -> ½·0.64 = 0.32, gradient 0 (the clipped branch is constant).
    # Token 1: V 0.9, V_old 1.0, Ret 0.5: 0.16 both -> 0.08, grad (V-Ret)/2 = 0.2.
    # Token 2 is padding. Token mean over 2: 0.2.
    cfg = schema.algo_config(schema.sampling_config())
    values = jnp.array([[1.5, 0.9, 7.0]])
    args = (jnp.array([[1.0, 1.0, 0.0]]), jnp.array([[2.0, 0.5, 0.0]]), jnp.array([[1.0, 1, 0]]))
    (loss, m), g = jax.value_and_grad(
        lambda v: objectives.value_loss(v, *args, cfg), has_aux=True)(values)
    np.testing.assert_allclose(loss, 0.2, atol=1e-6)
    np.testing.assert_allclose(g, [[0.0, 0.2, 0.0]], atol=1e-6)
    self.assertEqual(float(m["value_clip_frac"]), 0.5)
    cfg.value.value_clip = 0.0  # off: ½·(0.25 + 0.16)/2 = 0.1025
    loss, _ = objectives.value_loss(values, *args, cfg)
    np.testing.assert_allclose(loss, 0.1025, atol=1e-6)


if __name__ == "__main__":
  absltest.main()
