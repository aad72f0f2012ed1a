"""Loss aggregations: hand-worked values, and exact accumulation over splits."""
import functools
import importlib

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from jaxrl_llm import objectives
from jaxrl_llm.objectives import aggregation


class AggregationValuesTest(parameterized.TestCase):
  # ℓ = [[1, 2, 3], [4, ·, ·], [·, ·, ·]], lengths [3, 1, 0]: 4 tokens, 2 non-empty
  # sequences (the empty row counts for neither).
  LOSS = jnp.array([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0], [99.0, 99.0, 99.0]])
  MASK = jnp.array([[1.0, 1, 1], [1, 0, 0], [0, 0, 0]])

  @parameterized.parameters(
      ("token_mean", (1 + 2 + 3 + 4) / 4),  # 2.5
      ("seq_mean_token_mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),  # (2 + 4)/2 = 3
      ("seq_mean_token_sum", (6 + 4) / 2),  # 5
      ("seq_mean_token_sum_norm", (6 + 4) / (2 * 10)),  # norm_length 10: 0.5
  )
  def test_values(self, name, want):
    cfg = type("LossCfg", (), {"norm_length": 10})()
    counts = objectives.batch_counts(self.MASK)
    self.assertEqual((float(counts["tokens"]), float(counts["sequences"])), (4.0, 2.0))
    got = objectives.AGGREGATIONS[name](self.LOSS, self.MASK, counts, cfg)
    np.testing.assert_allclose(got, want, rtol=1e-6)

  def test_empty_batch_is_zero_not_nan(self):
    mask = jnp.zeros((2, 3))
    counts = objectives.batch_counts(mask)
    cfg = type("LossCfg", (), {"norm_length": 10})()
    for fn in objectives.AGGREGATIONS.values():
      self.assertEqual(float(fn(self.LOSS[:2], mask, counts, cfg)), 0.0)

  def test_norm_length_required(self):
    cfg = type("LossCfg", (), {"norm_length": 0})()
    with self.assertRaisesRegex(ValueError, "norm_length"):
      aggregation.seq_mean_token_sum_norm(self.LOSS, self.MASK, {"sequences": 1.0}, cfg)


# ------------------------------------------------------------------ exact accumulation

B, T, D = 16, 6, 3


def make_batch():
  """A minibatch whose logp depends on parameters θ through a tiny linear 'model'."""
  keys = jax.random.split(jax.random.PRNGKey(0), 6)
  lengths = jax.random.randint(keys[0], (B,), 1, T + 1)
  lengths = lengths.at[0].set(0).at[1].set(0)  # two empty rows, both in micro-batch 0
  mask = (jnp.arange(T)[None, :] < lengths[:, None]).astype(jnp.float32)
  x = jax.random.normal(keys[1], (B, T, D))
  theta = jax.random.normal(keys[2], (D,))
  logp0 = -jax.nn.softplus(jnp.einsum("btd,d->bt", x, theta))
  return dict(
      x=x,
      old_logp=logp0 + 0.3 * jax.random.normal(keys[3], (B, T)),  # off-policy: clips fire
      ref_logp=logp0 + 0.3 * jax.random.normal(keys[4], (B, T)),
      adv=jax.random.normal(keys[5], (B,)),
      mask=mask,
  ), theta


def loss_fn(theta, batch, counts, cfg):
  logits_BT = jnp.einsum("btd,d->bt", batch["x"], theta)
  logp = -jax.nn.softplus(logits_BT)
  entropy = jax.nn.softplus(-logits_BT)  # any θ-dependent stand-in for H
  return objectives.policy_loss(logp, batch["old_logp"], batch["adv"], batch["mask"], cfg,
                                ref_logp=batch["ref_logp"], entropy=entropy, counts=counts)


def preset(name):
  cfg = importlib.import_module(f"configs.{name}").get_config().algo
  cfg.loss.entropy_coef = 0.01  # exercise the entropy term too
  if name == "dapo":
    cfg.loss.dual_clip = 3.0
  return cfg


SUMMED_METRICS = ("pg_loss", "kl_loss", "entropy_loss", "approx_kl", "ratio_mean", "entropy",
                  "kl_ref", "clip_frac")

# One preset per aggregation, plus the ratio/trust-region kinds with per-sequence terms.
SPLIT_PRESETS = ("grpo", "dapo", "rloo", "dr_grpo", "gspo", "gmpo", "cispo")


class ExactAccumulationTest(parameterized.TestCase):

  @parameterized.parameters(*SPLIT_PRESETS)
  def test_micro_batches(self, name):
    cfg = preset(name)
    batch, theta = make_batch()
    grad_fn = jax.jit(jax.value_and_grad(functools.partial(loss_fn, cfg=cfg), has_aux=True))
    (loss, metrics), grad = grad_fn(theta, batch, None)
    counts = objectives.batch_counts(batch["mask"])  # the WHOLE minibatch's counts

    pieces = [jax.tree.map(lambda a, i=i: a[4 * i:4 * (i + 1)], batch) for i in range(4)]
    outs = [grad_fn(theta, piece, counts) for piece in pieces]
    np.testing.assert_allclose(sum(o[0][0] for o in outs), loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(sum(o[1] for o in outs), grad, rtol=1e-5, atol=1e-7)
    for key in SUMMED_METRICS:
      if key in metrics:
        np.testing.assert_allclose(sum(o[0][1][key] for o in outs), metrics[key], rtol=1e-5,
                                   atol=1e-7, err_msg=key)
    np.testing.assert_allclose(min(o[0][1]["ratio_min"] for o in outs), metrics["ratio_min"])
    np.testing.assert_allclose(max(o[0][1]["ratio_max"] for o in outs), metrics["ratio_max"])

    # The split is real: averaging per-piece losses with local normalisers (naive
    # gradient accumulation) gives a different gradient.
    naive = sum(grad_fn(theta, piece, None)[1] for piece in pieces) / 4
    self.assertGreater(float(jnp.abs(naive - grad).max()), 1e-4)

  # One preset per aggregation (micro-batching covers the other kinds of term).
  @parameterized.parameters("grpo", "dapo", "rloo", "dr_grpo")
  @pytest.mark.mesh
  def test_eight_device_data_parallel(self, name):
    self.assertEqual(jax.device_count(), 8)
    cfg = preset(name)
    batch, theta = make_batch()
    (loss, _), grad = jax.jit(jax.value_and_grad(functools.partial(loss_fn, cfg=cfg),
                                                 has_aux=True))(theta, batch, None)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

    def per_device(theta, local_batch):  # 2 sequences per device
      counts = jax.tree.map(lambda c: jax.lax.psum(c, "data"),
                            objectives.batch_counts(local_batch["mask"]))
      (local_loss, _), local_grad = jax.value_and_grad(loss_fn, has_aux=True)(
          theta, local_batch, counts, cfg)
      # θ is replicated: shard_map's transpose already sums its gradient over devices.
      return jax.lax.psum(local_loss, "data"), local_grad

    dp = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("data")),
                               out_specs=(P(), P())))
    dp_loss, dp_grad = dp(theta, batch)
    np.testing.assert_allclose(dp_loss, loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dp_grad, grad, rtol=1e-5, atol=1e-7)

    # And plain jit over a batch sharded with NamedSharding across the 8 devices.
    sharded = jax.device_put(batch, NamedSharding(mesh, P("data")))
    self.assertLen(sharded["x"].sharding.device_set, 8)
    (gspmd_loss, _), gspmd_grad = jax.jit(jax.value_and_grad(
        functools.partial(loss_fn, cfg=cfg, counts=None), has_aux=True))(theta, sharded)
    np.testing.assert_allclose(gspmd_loss, loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gspmd_grad, grad, rtol=1e-5, atol=1e-7)


if __name__ == "__main__":
  absltest.main()
