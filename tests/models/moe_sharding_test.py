"""Expert parallelism: an MoE model on meshes of 8 CPU devices (expert 4 x data 2, expert 2
x fsdp 2 x tensor 2, expert 8) computes what it computes on one device (logits, and the
gradient and result of one update). The layer itself: moe_parallel_test.py."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import absltest, parameterized
from jax.sharding import PartitionSpec as P

from jaxrl_llm import models
from jaxrl_llm import sharding as sh
from jaxrl_llm.models.config import ModelConfig

CFG = ModelConfig(model_type="qwen3_moe", vocab_size=96, hidden_size=32, intermediate_size=48,
                  num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True,
                  num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                  moe_layers=(1, 2), router_aux_loss_coef=0.01)


def _batch():
  rng = np.random.RandomState(0)
  ids = rng.randint(0, CFG.vocab_size, (8, 12)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[3, :4] = 0
  return ids, mask


def _update(model, ids, mask):
  """Next-token NLL plus the load-balancing loss; one SGD step. Returns (loss, grads, params)."""
  def loss_fn(params):
    m = model.replace(params=params)
    logits, _, routing = models.forward(m, ids, models.positions_from_mask(mask), mask,
                                        with_router=True)
    logp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
    w = mask[:, 1:].astype(jnp.float32)
    from jaxrl_llm.models import moe
    return jnp.sum(nll * w) / jnp.sum(w) + CFG.router_aux_loss_coef * moe.aux_loss(
        routing, CFG.num_experts)
  loss, grads = jax.value_and_grad(loss_fn)(model.params)
  opt = optax.sgd(0.5)
  updates, _ = opt.update(grads, opt.init(model.params), model.params)
  return loss, grads, optax.apply_updates(model.params, updates)


@functools.cache
def _one_device():
  """The model on one device, and its logits and update (the reference of every mesh)."""
  one = models.init(CFG, jax.random.key(0))
  ids, mask = _batch()
  return one, models.compute_logits(one, ids, mask), jax.jit(_update)(one, ids, mask)


@pytest.mark.mesh
class ExpertParallelTest(parameterized.TestCase):

  def test_expert_4_by_data_2_equals_one_device(self):
    one = _one_device()[0]
    mesh = sh.make_mesh(dict(data=2, fsdp=1, expert=4, tensor=1))
    self.assertEqual(dict(mesh.shape), dict(data=2, fsdp=1, expert=4, context=1, tensor=1))
    placed = models.place(one, mesh)
    experts = placed.params["layers_1"]["mlp"]["gate_up_proj"]
    self.assertEqual(experts.sharding.spec, P(None, "expert", None, None, None))
    self.assertEqual(len(experts.addressable_shards[0].data.shape), 5)
    self.assertEqual(experts.addressable_shards[0].data.shape[1], CFG.num_experts // 4)
    _check_equal(one, placed, mesh)

  @parameterized.named_parameters(
      ("expert2_fsdp2_tensor2", dict(data=1, fsdp=2, expert=2, tensor=2)),
      ("expert8", dict(data=1, fsdp=1, expert=8, tensor=1)))
  def test_other_meshes_equal_one_device(self, shape):
    one = _one_device()[0]
    mesh = sh.make_mesh(shape)
    _check_equal(one, models.place(one, mesh), mesh)


def _check_equal(one, placed, mesh):
  """Logits, and the loss, gradients and parameters after one update, sharded and not."""
  ids, mask = _batch()
  _, want, (loss1, grads1, params1) = _one_device()
  ids_s, mask_s = (sh.put(x, sh.named_sharding((sh.BATCH, None), x.shape, mesh, sh.DEFAULT_RULES))
                   for x in (ids, mask))
  got = models.compute_logits(placed, ids_s, mask_s)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=0)

  loss8, grads8, params8 = jax.jit(_update)(placed, ids_s, mask_s)
  np.testing.assert_allclose(float(loss8), float(loss1), rtol=1e-6)
  close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=1e-4)
  jax.tree.map(close, grads8, grads1)
  jax.tree.map(close, params8, params1)


if __name__ == "__main__":
  absltest.main()
