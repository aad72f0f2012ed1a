"""Per-token log-probs and entropies, whole and chunked."""
import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.extend.core as jax_core  # jax.core.jaxprs_in_params is gone in jax 0.11
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives


class TokenLogpTest(absltest.TestCase):

  def test_hand_worked(self):
    # logits [0, 0]: p = [½, ½], logp = -ln 2 = -0.693147, H = ln 2.
    # logits [0, 2] at temperature 2 -> [0, 1]: logp(1) = 1 - ln(1 + e) = -0.313262,
    # logp(0) = -1.313262; H = -(0.268941·-1.313262 + 0.731059·-0.313262) = 0.582203.
    logits = jnp.array([[[0.0, 0.0]], [[0.0, 2.0]]])
    logp, entropy = objectives.token_logp_and_entropy(logits, jnp.array([[1], [1]]), 2.0)
    np.testing.assert_allclose(logp, [[-math.log(2)], [1 - math.log(1 + math.e)]], atol=1e-6)
    np.testing.assert_allclose(entropy, [[math.log(2)], [0.582203]], atol=1e-6)
    np.testing.assert_allclose(objectives.token_logp(logits, jnp.array([[0], [0]]), 2.0),
                               [[-math.log(2)], [-math.log(1 + math.e)]], atol=1e-6)
    np.testing.assert_allclose(objectives.token_entropy(logits, 2.0), entropy, atol=1e-6)

  def test_greedy_temperature_counts_as_one(self):
    logits = jnp.array([[[0.0, 2.0]]])
    np.testing.assert_allclose(objectives.token_logp(logits, jnp.array([[1]]), 0.0),
                               objectives.token_logp(logits, jnp.array([[1]]), 1.0))

  def test_float32_from_bfloat16(self):
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 7)).astype(jnp.bfloat16)
    logp, entropy = objectives.token_logp_and_entropy(logits, jnp.zeros((2, 3), jnp.int32))
    self.assertEqual((logp.dtype, entropy.dtype), (jnp.float32, jnp.float32))
    want = jax.nn.log_softmax(logits.astype(jnp.float32), -1)[..., 0]
    np.testing.assert_allclose(logp, want, atol=1e-6)


Bn, Tn, Dn, Vn = 2, 10, 8, 37


def chunk_inputs():
  keys = jax.random.split(jax.random.PRNGKey(1), 3)
  hidden = jax.random.normal(keys[0], (Bn, Tn, Dn))
  w = jax.random.normal(keys[1], (Dn, Vn))
  targets = jax.random.randint(keys[2], (Bn, Tn), 0, Vn)
  return hidden, w, targets


def weighted_sum(logp, entropy):
  """A scalar that depends on every position differently (so gradients are informative)."""
  weights = jnp.arange(1.0, 1.0 + Tn)[None, :]
  return jnp.sum(logp * weights) + 0.5 * jnp.sum(entropy * weights)


class ChunkedTest(parameterized.TestCase):

  @parameterized.parameters(1, 4, 64)  # one position, T % C != 0, C > T
  def test_equals_unchunked_values_and_gradients(self, chunk_size):
    hidden, w, targets = chunk_inputs()

    def whole(hidden, w):
      return weighted_sum(*objectives.token_logp_and_entropy(hidden @ w, targets, 0.7))

    def chunked(hidden, w):
      return weighted_sum(*objectives.chunked_token_logp_and_entropy(
          hidden, targets, lambda h: h @ w, chunk_size=chunk_size, temperature=0.7))

    np.testing.assert_allclose(
        objectives.chunked_token_logp_and_entropy(hidden, targets, lambda h: h @ w,
                                                  chunk_size=chunk_size, temperature=0.7),
        objectives.token_logp_and_entropy(hidden @ w, targets, 0.7), rtol=1e-5, atol=1e-6)
    g_whole = jax.jit(jax.grad(whole, argnums=(0, 1)))(hidden, w)
    g_chunked = jax.jit(jax.grad(chunked, argnums=(0, 1)))(hidden, w)
    for a, b in zip(g_chunked, g_whole):
      self.assertGreater(float(jnp.abs(b).max()), 0.1)
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

  def test_no_whole_logits_in_forward_or_backward(self):
    hidden, w, targets = chunk_inputs()

    def largest_vocab_array(fn):
      """Elements of the largest array with a vocab-sized last dim in fn's jaxpr."""
      jaxpr = jax.make_jaxpr(jax.grad(fn, argnums=(0, 1)))(hidden, w)
      sizes = []

      def visit(jaxpr):
        for eqn in jaxpr.eqns:
          for var in eqn.outvars:
            shape = getattr(var.aval, "shape", ())
            if shape and shape[-1] == Vn:
              sizes.append(math.prod(shape))
          for sub in jax_core.jaxprs_in_params(eqn.params):
            visit(sub)

      visit(jaxpr.jaxpr)
      return max(sizes)

    def whole(hidden, w):
      return weighted_sum(*objectives.token_logp_and_entropy(hidden @ w, targets))

    def chunked(hidden, w):
      return weighted_sum(*objectives.chunked_token_logp_and_entropy(
          hidden, targets, lambda h: h @ w, chunk_size=4))

    # The detector sees the whole [B, T, V] logits of the plain version ...
    self.assertGreaterEqual(largest_vocab_array(whole), Bn * Tn * Vn)
    # ... and only [B, C, V] chunks (or the [D, V] weight) in the chunked one.
    self.assertLessEqual(largest_vocab_array(chunked), max(Bn * 4 * Vn, Dn * Vn))


if __name__ == "__main__":
  absltest.main()
