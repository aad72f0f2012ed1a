"""The training attention kernels agree with the plain one, values and gradients."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from jaxrl_llm import sharding as sh
from jaxrl_llm.models import attention


def _inputs(B=2, T=96, K=2, G=2, d=16, dtype=jnp.float32, seed=0):
  rng = np.random.RandomState(seed)
  q = jnp.asarray(rng.randn(B, T, K, G, d), dtype)
  k = jnp.asarray(rng.randn(B, T, K, d), dtype)
  v = jnp.asarray(rng.randn(B, T, K, d), dtype)
  valid = np.ones((B, T), np.int32)
  valid[0, :T // 3] = 0  # a left-padded prompt: its padding queries see no key at all
  valid[-1, T - 7:] = 0  # padding after the end of a completion
  return q, k, v, jnp.asarray(valid)


def _loss(impl, valid, block=attention.BLOCK, **kw):
  """A scalar of the real queries' outputs (padding queries' outputs are never read)."""
  weights = jnp.asarray(np.random.RandomState(1).randn(*valid.shape, 1, 1, 1), jnp.float32)

  def loss(q, k, v):
    out = attention.causal_attention(q, k, v, valid, impl=impl, block=block, **kw)
    return jnp.sum(out.astype(jnp.float32) * weights * valid[:, :, None, None, None])
  return loss


# Jitted: one program per kernel and setting, rather than one per operation (eager).
_attend = jax.jit(attention.causal_attention, static_argnames=("impl", "mesh", "rules", "block"))


def _grads(impl, valid, block=attention.BLOCK, argnums=(0, 1, 2), **kw):
  """The gradient function of `_loss`, jitted."""
  return jax.jit(jax.grad(_loss(impl, valid, block, **kw), argnums=argnums))


@functools.cache
def _xla_reference():
  """The plain attention's outputs and gradients on the default `_inputs()` (the `block`
  of `_loss` is the blockwise kernel's: the xla one's loss is the same for any)."""
  q, k, v, valid = _inputs()
  return _attend(q, k, v, valid, impl="xla"), _grads("xla", valid)(q, k, v)


class CausalAttentionTest(parameterized.TestCase):

  @parameterized.parameters(16, 40, 96, 512)  # blocks that divide T, do not, or exceed it
  def test_blockwise_matches_xla_values_and_gradients(self, block):
    q, k, v, valid = _inputs()
    want, g_want = _xla_reference()
    got = _attend(q, k, v, valid, impl="blockwise", block=block)
    # Every query, padding ones included (uniform weights over the sequence in both).
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
    g_got = _grads("blockwise", valid, block)(q, k, v)
    for a, b in zip(g_got, g_want):
      np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)

  def test_blockwise_bfloat16_within_bf16_rounding(self):
    q, k, v, valid = _inputs(dtype=jnp.bfloat16)
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    exact = _attend(q32, k32, v32, valid, impl="xla")
    real = np.asarray(valid, bool)
    err = lambda impl: float(jnp.abs(_attend(
        q, k, v, valid, impl=impl, block=32).astype(jnp.float32) - exact)[real].max())
    self.assertEqual(_attend(q, k, v, valid, impl="blockwise").dtype, jnp.bfloat16)
    # Both round the probabilities and the output to bf16 (8 mantissa bits): errors alike.
    self.assertLess(err("blockwise"), 2 * err("xla") + 1e-2)
    g_exact = _grads("xla", valid, argnums=0)(q32, k32, v32)
    g_block = _grads("blockwise", valid, 32, argnums=0)(q, k, v).astype(jnp.float32)
    g_xla = _grads("xla", valid, argnums=0)(q, k, v).astype(jnp.float32)
    self.assertLess(float(jnp.abs(g_block - g_exact).max()),
                    2 * float(jnp.abs(g_xla - g_exact).max()) + 2e-2)

  def test_blockwise_never_holds_the_whole_score_tensor(self):
    """Compiled gradient programs: the blockwise one's temporaries do not grow as T * T."""
    q, k, v, valid = _inputs(B=1, T=2048, K=1, G=2, d=16)

    def temp_bytes(impl):
      grad = jax.jit(jax.grad(_loss(impl, valid, 128), argnums=(0, 1, 2)))
      return grad.lower(q, k, v).compile().memory_analysis().temp_size_in_bytes

    scores = 1 * 1 * 2 * 2048 * 2048 * 4  # one float32 [B, K, G, T, S]
    self.assertGreater(temp_bytes("xla"), scores)
    self.assertLess(temp_bytes("blockwise"), scores / 2)

  def test_cudnn_call_has_the_same_semantics(self):
    """The arguments handed to cuDNN (mask + is_causal), run by jax's reference implementation."""
    q, k, v, valid = _inputs(dtype=jnp.bfloat16, T=64)
    real = np.asarray(valid, bool)
    want = _attend(q, k, v, valid, impl="xla").astype(jnp.float32)
    got = jax.jit(functools.partial(attention._cudnn, implementation="xla"))(
        q, k, v, valid).astype(jnp.float32)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-2, rtol=0)

  @pytest.mark.mesh
  def test_splash_kernel_matches_xla(self):
    """The TPU Pallas kernel, run by the Pallas interpreter on this CPU, sharded over a mesh."""
    q, k, v, valid = _inputs(T=128, d=64)
    real = np.asarray(valid, bool)
    mesh = sh.make_mesh(dict(data=2, fsdp=1, tensor=2), jax.devices()[:4])
    got = jax.jit(functools.partial(attention.causal_attention, impl="splash", mesh=mesh,
                                    rules=sh.DEFAULT_RULES))(q, k, v, valid)
    want = _attend(q, k, v, valid, impl="xla")
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-6, rtol=0)
    g_got = _grads("splash", valid)(q, k, v)
    g_want = _grads("xla", valid)(q, k, v)
    for a, b in zip(g_got, g_want):
      np.testing.assert_allclose(a, b, atol=5e-5, rtol=0)
    with self.assertRaisesRegex(ValueError, "multiple of 128"):
      attention.causal_attention(*_inputs(T=96)[:4], impl="splash")

  @parameterized.parameters((2, 256), (4, 512))
  @pytest.mark.mesh
  def test_splash_per_context_block_matches_xla(self, context, T):
    """With the sequence cut over a context axis, each device runs the kernel on its own
    block of queries (T / context of them) against the gathered keys: values and gradients
    as the plain attention's, left padding and padding at the end included."""
    q, k, v, valid = _inputs(B=2, T=T, K=2, G=2, d=64)
    real = np.asarray(valid, bool)
    mesh = sh.make_mesh(dict(data=1, fsdp=1, context=context, tensor=2),
                        jax.devices()[:2 * context])
    splash = functools.partial(attention.causal_attention, impl="splash", mesh=mesh,
                               rules=sh.DEFAULT_RULES)
    local_queries = [x.aval.shape for e in jax.make_jaxpr(splash)(q, k, v, valid).eqns
                     if e.primitive.name == "shard_map"
                     for x in e.params["jaxpr"].invars if x.aval.ndim == 5]
    self.assertEqual(local_queries, [(2, T // context, 1, 2, 64)])  # kv heads over tensor 2
    want = _attend(q, k, v, valid, impl="xla")
    np.testing.assert_allclose(np.asarray(jax.jit(splash)(q, k, v, valid))[real],
                               np.asarray(want)[real], atol=2e-6, rtol=0)
    g_got = _grads("splash", valid, mesh=mesh, rules=sh.DEFAULT_RULES)(q, k, v)
    g_want = _grads("xla", valid)(q, k, v)
    for a, b in zip(g_got, g_want):
      np.testing.assert_allclose(a, b, atol=5e-5, rtol=0)
    with self.assertRaisesRegex(ValueError, r"multiple of 128 per context shard \(x2\)"):
      jax.jit(functools.partial(splash, mesh=sh.make_mesh(
          dict(data=1, fsdp=1, context=2, tensor=1), jax.devices()[:2])))(
              *_inputs(T=128, d=64)[:4])

  def test_auto_picks_per_platform(self):
    def resolve(impl, where, dtype, length, head_dim=128, capability=None):
      return attention.resolve(impl, where=where, dtype=dtype, head_dim=head_dim, length=length,
                               capability=capability)
    self.assertEqual(resolve("auto", "cpu", jnp.float32, 96), "xla")
    self.assertEqual(resolve("auto", "cpu", jnp.float32, 4096), "blockwise")
    self.assertEqual(resolve("auto", "gpu", jnp.bfloat16, 96), "cudnn")
    self.assertEqual(resolve("auto", "gpu", jnp.float32, 4096), "blockwise")
    self.assertEqual(resolve("auto", "tpu", jnp.bfloat16, 1024), "splash")
    self.assertEqual(resolve("auto", "tpu", jnp.bfloat16, 1000), "blockwise")
    tpu = lambda shards: attention.resolve("auto", where="tpu", dtype=jnp.bfloat16,
                                           head_dim=128, length=1152, seq_shards=shards)
    self.assertEqual((tpu(1), tpu(2)), ("splash", "blockwise"))  # 2 pieces of 576: not splash
    self.assertEqual(resolve("blockwise", "cpu", jnp.float32, 8), "blockwise")
    # What cuDNN cannot take is decided up front (no fallback on an exception): a head dim
    # of 256 only from Hopper on, one that is not a multiple of 8 never.
    self.assertEqual(resolve("auto", "gpu", jnp.bfloat16, 96, head_dim=256), "xla")
    self.assertEqual(resolve("auto", "gpu", jnp.bfloat16, 96, head_dim=256, capability=(9, 0)),
                     "cudnn")
    self.assertEqual(resolve("auto", "gpu", jnp.bfloat16, 4096, head_dim=100), "blockwise")
    self.assertEqual(resolve("auto", "gpu", jnp.bfloat16, 97), "xla")  # odd: the mask's bias
    with self.assertRaisesRegex(ValueError, "attention='cudnn': cuDNN's fused attention takes a "
                                "head dim that is a multiple of 8 up to 128, not 100"):
      resolve("cudnn", "gpu", jnp.bfloat16, 96, head_dim=100)
    with self.assertRaisesRegex(ValueError, "attention='cudnn': cuDNN runs on NVIDIA GPUs"):
      resolve("cudnn", "cpu", jnp.bfloat16, 96)


if __name__ == "__main__":
  absltest.main()
