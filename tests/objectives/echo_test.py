"""echo on hand-worked numbers: a weighted NLL on environment tokens over its own count."""
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from jaxrl_llm.objectives import echo

MODEL, TOOL, USER = 1, 2, 3
LOGP = np.array([[-1.0, -2.0, -0.5], [-0.1, -3.0, -4.0]], np.float32)
ROLES = np.array([[MODEL, TOOL, TOOL], [TOOL, USER, MODEL]], np.int32)
ALPHAS = {TOOL: 0.1, USER: 0.5}


class EchoTest(absltest.TestCase):

  def test_hand_worked(self):
    w = echo.echo_weights(jnp.asarray(ROLES), ALPHAS)
    np.testing.assert_allclose(w, [[0, 0.1, 0.1], [0.1, 0.5, 0]], rtol=1e-6)
    loss, metrics = echo.echo_loss(jnp.asarray(LOGP), w)
    # N = 4 tokens; (0.1*2 + 0.1*0.5 + 0.1*0.1 + 0.5*3) / 4 = 1.76 / 4
    np.testing.assert_allclose(loss, 0.44, rtol=1e-6)
    np.testing.assert_allclose(metrics["echo_nll"], (2 + 0.5 + 0.1 + 3) / 4, rtol=1e-6)
    grad = jax.grad(lambda lp: echo.echo_loss(lp, w)[0])(jnp.asarray(LOGP))
    np.testing.assert_allclose(grad, [[0, -0.025, -0.025], [-0.025, -0.125, 0]], rtol=1e-6)

  def test_pieces_of_a_minibatch_sum_to_the_whole(self):
    w = echo.echo_weights(jnp.asarray(ROLES), ALPHAS)
    whole, _ = echo.echo_loss(jnp.asarray(LOGP), w)
    count = echo.echo_count(w)
    pieces = sum(echo.echo_loss(jnp.asarray(LOGP[i:i + 1]), w[i:i + 1], count)[0]
                 for i in range(2))
    np.testing.assert_allclose(pieces, whole, rtol=1e-6)

  def test_other_tokens_may_hold_anything_and_no_chosen_token_gives_zero(self):
    logp = LOGP.copy()
    logp[0, 0] = -np.inf  # a model token: not echo's
    w = echo.echo_weights(jnp.asarray(ROLES), ALPHAS)
    loss, _ = echo.echo_loss(jnp.asarray(logp), w)
    np.testing.assert_allclose(loss, 0.44, rtol=1e-6)
    grad = jax.grad(lambda lp: echo.echo_loss(lp, w)[0])(jnp.asarray(logp))
    self.assertTrue(np.all(np.isfinite(grad)))
    none = echo.echo_weights(jnp.asarray(ROLES), {})
    loss, metrics = echo.echo_loss(jnp.asarray(LOGP), none)
    self.assertEqual(float(loss), 0.0)
    self.assertEqual(float(metrics["echo_nll"]), 0.0)

  def test_bf16_log_probs(self):
    w = echo.echo_weights(jnp.asarray(ROLES), ALPHAS)
    loss, _ = echo.echo_loss(jnp.asarray(LOGP, jnp.bfloat16), w)
    self.assertEqual(loss.dtype, jnp.float32)
    np.testing.assert_allclose(loss, 0.44, rtol=1e-2)


if __name__ == "__main__":
  absltest.main()
