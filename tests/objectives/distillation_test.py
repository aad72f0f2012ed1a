"""On-policy distillation and prime-rl's trust regions: hand-worked values and gradients.

prime-rl's `src/prime_rl/trainer/rl/loss.py` (commit 559b447): `default_loss_fn` (our
`dppo_tv`), `ipo_loss_fn` (`ipo`) and `ref_kl_loss_fn` (`distillation.reverse_kl_loss`);
miles' `apply_opd_kl_to_advantages` (`distillation.shaped_advantages`).
"""
import functools
import math

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives
from jaxrl_llm.config import schema

C = 1e-3  # log_ratio_coef, prime-rl's kl_tau


def algo(trust_region="dppo_tv", **loss):
  cfg = schema.algo_config(schema.sampling_config())
  cfg.kl.coef, cfg.kl.placement = 0.0, "none"
  cfg.loss.ratio, cfg.loss.trust_region, cfg.loss.aggregation = "token", trust_region, "token_mean"
  for key, value in loss.items():
    cfg.loss[key] = value
  return cfg


def probs_to_logp(pi, mu):
  return jnp.log(jnp.array([pi], jnp.float32)), jnp.log(jnp.array([mu], jnp.float32))


def loss_and_grad(cfg, pi, mu, adv, **kw):
  logp, old = probs_to_logp(pi, mu)
  mask = jnp.ones_like(logp)
  fn = functools.partial(objectives.policy_loss, cfg=cfg, **kw)
  (loss, metrics), grad = jax.value_and_grad(
      lambda lp: fn(lp, old, jnp.array([adv], jnp.float32), mask), has_aux=True)(logp)
  return float(loss), np.asarray(grad)[0], {k: float(v) for k, v in metrics.items()}


class DppoTvTest(absltest.TestCase):
  """Four tokens, μ = 0.5: π = 0.75 (moved up 0.25) or 0.25 (down 0.25), A = ±1."""

  PI = [0.75, 0.75, 0.25, 0.25]
  MU = [0.5] * 4
  ADV = [1.0, -1.0, -1.0, 1.0]

  def test_masks_by_advantage_sign_and_adds_the_squared_log_ratio(self):
    loss, grad, metrics = loss_and_grad(algo("dppo_tv"), self.PI, self.MU, self.ADV)
    up, down = math.log(1.5), math.log(0.5)
    # token 1: A > 0 and π - μ = 0.25 > 0.2: masked, only c(log ρ)²
    # token 2: A < 0, π rose: kept, -ρA = +1.5
    # token 3: A < 0 and π - μ = -0.25 < -0.2: masked
    # token 4: A > 0, π fell: kept, -ρA = -0.5
    per_token = [C * up ** 2, 1.5 + C * up ** 2, C * down ** 2, -0.5 + C * down ** 2]
    grads = [2 * C * up, 1.5 + 2 * C * up, 2 * C * down, -0.5 + 2 * C * down]
    self.assertAlmostEqual(loss, sum(per_token) / 4, places=6)
    np.testing.assert_allclose(grad, np.array(grads) / 4, rtol=1e-5)
    self.assertAlmostEqual(metrics["prob_mask_frac"], 0.5)
    self.assertAlmostEqual(metrics["prob_mask_frac_high"], 0.25)
    self.assertAlmostEqual(metrics["prob_mask_frac_low"], 0.25)

  def test_wider_region_masks_nothing(self):
    loss, _, metrics = loss_and_grad(algo("dppo_tv", prob_low=0.3, prob_high=0.3), self.PI,
                                     self.MU, self.ADV)
    up, down = math.log(1.5), math.log(0.5)
    expected = (-1.5 + 1.5 + 0.5 - 0.5 + 2 * C * (up ** 2 + down ** 2)) / 4
    self.assertAlmostEqual(loss, expected, places=6)
    self.assertEqual(metrics["prob_mask_frac"], 0.0)

  def test_on_policy_is_minus_advantage(self):
    loss, grad, _ = loss_and_grad(algo("dppo_tv"), [0.3, 0.6], [0.3, 0.6], [2.0, -1.0])
    self.assertAlmostEqual(loss, (-2.0 + 1.0) / 2, places=6)
    np.testing.assert_allclose(grad, [-1.0, 0.5], rtol=1e-5)


class IpoTest(absltest.TestCase):

  def test_symmetric_region_whatever_the_sign(self):
    # π - μ: +0.25, -0.25 (both masked at 0.1 whatever A's sign), +0.05 (kept).
    loss, grad, metrics = loss_and_grad(algo("ipo", prob_low=0.1, prob_high=0.1),
                                        [0.75, 0.25, 0.55], [0.5, 0.5, 0.5], [-1.0, 1.0, 1.0])
    r = [1.5, 0.5, 1.1]
    per_token = [C * math.log(r[0]) ** 2, C * math.log(r[1]) ** 2,
                 -1.1 + C * math.log(r[2]) ** 2]
    grads = [2 * C * math.log(r[0]), 2 * C * math.log(r[1]), -1.1 + 2 * C * math.log(r[2])]
    self.assertAlmostEqual(loss, sum(per_token) / 3, places=6)
    np.testing.assert_allclose(grad, np.array(grads) / 3, rtol=1e-5)
    self.assertAlmostEqual(metrics["prob_mask_frac"], 2 / 3, places=6)


class ReverseKlLossTest(absltest.TestCase):
  """prime-rl's opd: -m·sg(log π_T - log π)·ρ + c·(log ρ)², token mean."""

  def distill(self, pi, mu, teacher, **distill):
    cfg = algo("clip")
    cfg.loss.pg_coef = 0.0
    cfg.distill.coef = 1.0
    for key, value in distill.items():
      cfg.distill[key] = value
    logp, old = probs_to_logp(pi, mu)
    teacher_logp = jnp.log(jnp.array([teacher], jnp.float32))
    mask = jnp.ones_like(logp)
    fn = lambda lp: objectives.policy_loss(lp, old, jnp.full_like(lp, 7.0), mask, cfg,
                                           teacher_logp=teacher_logp)
    (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(logp)
    return float(loss), np.asarray(grad)[0], {k: float(v) for k, v in metrics.items()}

  def test_hand_worked_tokens(self):
    # 1: on-policy, teacher halves the probability: signal log(0.25/0.5), ρ = 1.
    # 2: π fell 0.25 below μ (< -0.2): masked, only c(log ρ)².
    # 3: ρ = 1.2, the teacher prefers the token: signal log(0.9/0.6).
    loss, grad, metrics = self.distill([0.5, 0.25, 0.6], [0.5, 0.5, 0.5], [0.25, 0.9, 0.9])
    s1, s3 = math.log(0.5), math.log(1.5)
    per_token = [-s1, C * math.log(0.5) ** 2, -s3 * 1.2 + C * math.log(1.2) ** 2]
    grads = [-s1, 2 * C * math.log(0.5), -s3 * 1.2 + 2 * C * math.log(1.2)]
    self.assertAlmostEqual(loss, sum(per_token) / 3, places=6)
    np.testing.assert_allclose(grad, np.array(grads) / 3, rtol=1e-5)
    self.assertAlmostEqual(metrics["distill_loss"], loss, places=6)
    self.assertAlmostEqual(metrics["distill_mask_frac"], 1 / 3, places=6)
    self.assertEqual(metrics["pg_loss"], 0.0)  # no advantage is read (they are 7.0 here)
    self.assertNotIn("clip_frac", metrics)

  def test_gradient_is_the_policy_gradient_of_the_reverse_kl(self):
    # On-policy, for one softmax over 3 tokens with every token sampled once (weights π):
    # Σ_y π(y)·∇ℓ(y) equals ∇ KL(π ‖ π_T) of the distribution (no mask, no c term at ρ=1).
    z = jnp.array([0.3, -0.2, 0.5])
    teacher = jax.nn.log_softmax(jnp.array([1.0, 0.0, -1.0]))
    cfg = algo("clip")
    cfg.loss.pg_coef, cfg.distill.coef = 0.0, 1.0

    def sampled_estimate(z):
      logp = jax.nn.log_softmax(z)[None, :]
      probs = jax.lax.stop_gradient(jnp.exp(logp))
      old = jax.lax.stop_gradient(logp)
      adv = jnp.zeros_like(logp)
      # per-token losses weighted by π(y): token_mean with a mask of π·3 keeps Σ π ℓ
      loss, _ = objectives.policy_loss(logp, old, adv, 3 * probs, cfg,
                                       teacher_logp=teacher[None, :])
      return loss

    def reverse_kl(z):
      logp = jax.nn.log_softmax(z)
      return jnp.sum(jnp.exp(logp) * (logp - teacher))

    np.testing.assert_allclose(jax.grad(sampled_estimate)(z), jax.grad(reverse_kl)(z),
                               rtol=1e-5, atol=1e-7)

  def test_bfloat16_inputs_give_the_float32_loss(self):
    # Real models hand over bf16 log-probs; the term is computed in float32 from them, so
    # bf16 inputs give the float32 result on the bf16-rounded values.
    key = jax.random.PRNGKey(0)
    logp = -jax.random.uniform(key, (4, 6), minval=0.05, maxval=3.0)
    old = logp + 0.05 * jax.random.normal(jax.random.fold_in(key, 1), (4, 6))
    teacher = logp - jax.random.uniform(jax.random.fold_in(key, 2), (4, 6))
    mask = jnp.ones((4, 6))
    cfg = algo("clip")
    cfg.loss.pg_coef, cfg.distill.coef = 0.0, 1.0
    run = lambda dtype: objectives.policy_loss(
        logp.astype(dtype), old.astype(dtype), jnp.zeros((4,)), mask, cfg,
        teacher_logp=teacher.astype(dtype))[0]
    rounded = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)
    want = objectives.policy_loss(rounded(logp), rounded(old), jnp.zeros((4,)), mask, cfg,
                                  teacher_logp=rounded(teacher))[0]
    self.assertEqual(run(jnp.bfloat16).dtype, jnp.float32)
    np.testing.assert_allclose(run(jnp.bfloat16), want, rtol=1e-6)
    np.testing.assert_allclose(run(jnp.float32), want, rtol=2e-2)  # bf16: 8-bit mantissa

  def test_teacher_is_required(self):
    cfg = algo("clip")
    cfg.distill.coef = 1.0
    with self.assertRaisesRegex(ValueError, "teacher"):
      objectives.policy_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1,)),
                             jnp.ones((1, 2)), cfg)


class ShapingTest(absltest.TestCase):

  def test_miles_shaping(self):
    adv = jnp.array([[1.0, 1.0, 2.0]])
    old = jnp.array([[-1.0, -2.0, -0.5]])
    teacher = jnp.array([[-3.0, -1.0, -0.5]])
    mask = jnp.array([[1, 1, 0]])
    shaped = objectives.distill_shaped_advantages(adv, old, teacher, mask, 0.5)
    # 1 - 0.5·(-1 + 3) = 0; 1 - 0.5·(-2 + 1) = 1.5; padding 0
    np.testing.assert_allclose(shaped, [[0.0, 1.5, 0.0]])

  def test_reverse_kl_metric(self):
    old = jnp.array([[-1.0, -2.0, -9.0]])
    teacher = jnp.array([[-3.0, -1.0, 0.0]])
    self.assertAlmostEqual(float(objectives.reverse_kl(old, teacher, jnp.array([[1, 1, 0]]))),
                           (2.0 - 1.0) / 2)


if __name__ == "__main__":
  absltest.main()
