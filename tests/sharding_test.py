"""The one mesh: construction, rules, sharded parameters, sharded forward == unsharded."""
from unittest import mock
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_llm import models
from jaxrl_llm import sharding as sh
from tests import hf_testing

pytestmark = pytest.mark.mesh  # every test here builds or counts the 8-device mesh

MESH_222 = dict(data=2, fsdp=2, tensor=2)
# Sizes the 2x2x2 mesh divides, so every rule really shards.
EVEN = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
            num_key_value_heads=2)


class MeshTest(absltest.TestCase):

  def test_eight_fake_devices(self):
    self.assertEqual(jax.device_count(), 8)

  def test_shape_and_rest_axis(self):
    mesh = sh.make_mesh(MESH_222)
    self.assertEqual(dict(mesh.shape), dict(MESH_222, expert=1, context=1))  # absent: 1
    self.assertEqual(dict(sh.make_mesh(dict(data=-1, fsdp=1, tensor=2)).shape),
                     dict(data=4, fsdp=1, expert=1, context=1, tensor=2))
    self.assertEqual(dict(sh.make_mesh(dict(data=2, fsdp=1, expert=-1, tensor=1)).shape),
                     dict(data=2, fsdp=1, expert=4, context=1, tensor=1))

  def test_bad_mesh_shapes(self):
    with self.assertRaisesRegex(ValueError, r"needs 12 devices; there are 8"):
      sh.make_mesh(dict(data=3, fsdp=2, tensor=2))
    with self.assertRaisesRegex(ValueError, r"do not divide the 8 devices"):
      sh.make_mesh(dict(data=-1, fsdp=3, tensor=1))
    with self.assertRaisesRegex(ValueError, r"only one axis may be -1"):
      sh.make_mesh(dict(data=-1, fsdp=-1, tensor=1))
    with self.assertRaisesRegex(ValueError, r"config.mesh.tensor=0"):
      sh.make_mesh(dict(data=-1, fsdp=1, tensor=0))

  def test_split_meshes(self):
    cfg = {"data": -1, "fsdp": 1, "tensor": 1, "rollout_devices": 0}
    trainer, rollout = sh.split_meshes(type("Cfg", (), cfg))
    self.assertEqual((trainer.size, rollout), (8, None))
    cfg["rollout_devices"] = 2
    trainer, rollout = sh.split_meshes(type("Cfg", (), cfg))
    self.assertEqual(dict(trainer.shape), {"data": 6, "fsdp": 1, "expert": 1, "context": 1,
                                           "tensor": 1})
    self.assertEqual(dict(rollout.shape), {"data": 1, "fsdp": 1, "expert": 1, "context": 1,
                                           "tensor": 2})
    self.assertEqual(list(rollout.devices.flat), jax.devices()[:2])
    self.assertEqual(set(trainer.devices.flat), set(jax.devices()[2:]))
    cfg["rollout_devices"] = 8
    with self.assertRaisesRegex(ValueError, r"rollout_devices=8: expected 0 .* or 1 to 7"):
      sh.split_meshes(type("Cfg", (), cfg))

  def test_rules(self):
    mesh = sh.make_mesh(MESH_222)
    spec = sh.logical_to_spec((sh.BATCH, sh.SEQ, sh.EMBED), (8, 5, 64), mesh, sh.DEFAULT_RULES)
    self.assertEqual(spec, P(("data", "fsdp"), None, None))  # fsdp already used by the batch
    spec = sh.logical_to_spec((sh.EMBED, sh.HEADS, sh.HEAD_DIM), (64, 4, 16), mesh, sh.DEFAULT_RULES)
    self.assertEqual(spec, P("fsdp", "tensor", None))
    # An odd size stays replicated instead of failing.
    spec = sh.logical_to_spec((sh.VOCAB, sh.EMBED), (97, 40), mesh, sh.DEFAULT_RULES)
    self.assertEqual(spec, P(None, "fsdp"))
    # Named (a parameter): said once, with the parameter and the mesh axis. The record of what
    # was said is per process, and another test file may have run first in this worker.
    with mock.patch.object(sh, "_WARNED", set()), self.assertLogs("absl", "WARNING") as logs:
      for _ in range(2):
        sh.logical_to_spec((sh.VOCAB, sh.EMBED), (97, 40), mesh, sh.DEFAULT_RULES,
                           what="parameter embed")
    self.assertEqual([r.getMessage() for r in logs.records], [
        "parameter embed: its 'vocab' dimension (97) does not divide over mesh axis 'tensor' "
        "(2 devices): replicated over 'tensor' instead of sharded as config.mesh.rules asks"])
    with self.assertRaisesRegex(ValueError, "unknown logical axis 'embd'"):
      sh.logical_to_spec(("embd",), (4,), mesh, (("embd", "data"),))
    with self.assertRaisesRegex(ValueError, "unknown mesh axis 'model'"):
      sh.logical_to_spec((sh.EMBED,), (4,), mesh, ((sh.EMBED, "model"),))


class ShardedModelTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf = hf_testing.make_hf_model("qwen2", **EVEN)
    import tempfile
    cls.path = hf_testing.save_hf_model(cls.hf, tempfile.mkdtemp())
    cls.mesh = sh.make_mesh(MESH_222)
    cls.plain = models.from_pretrained(cls.path)
    cls.sharded = models.from_pretrained(cls.path, mesh=cls.mesh)

  def _assert_sharded(self, model):
    layers = model.params["layers"]
    qkv = layers["attn"]["qkv_proj"]["kernel"]  # [L, D, K, G + 2, Dh]: layers replicated
    self.assertEqual(qkv.sharding, NamedSharding(self.mesh, P(None, "fsdp", "tensor", None, None)))
    self.assertEqual(qkv.addressable_shards[0].data.shape, (3, 32, 1, 4, 16))
    embed = model.params["embed"]  # [V, D]
    self.assertEqual(embed.sharding.spec, P("tensor", "fsdp"))
    self.assertEqual(embed.addressable_shards[0].data.shape, (64, 32))
    down = layers["mlp"]["down_proj"]["kernel"]  # [L, F, D]
    self.assertEqual(down.sharding.spec, P(None, "tensor", "fsdp"))
    gate_up = layers["mlp"]["gate_up_proj"]["kernel"]  # [L, D, 2, F]
    self.assertEqual(gate_up.sharding.spec, P(None, "fsdp", None, "tensor"))

  def test_loaded_parameters_are_sharded_and_forward_matches(self):
    plain, sharded = self.plain, self.sharded
    self._assert_sharded(sharded)
    ids = np.random.RandomState(0).randint(3, 128, (8, 12))
    mask = np.ones_like(ids)
    mask[:3, :4] = 0  # some left padding
    batch_sharding = sh.named_sharding((sh.BATCH, sh.SEQ), ids.shape, self.mesh, sh.DEFAULT_RULES)
    ids_s, mask_s = jax.device_put(ids, batch_sharding), jax.device_put(mask, batch_sharding)
    got = models.compute_logits(sharded, ids_s, mask_s)
    self.assertEqual(got.sharding.spec, P(("data", "fsdp"), None, "tensor"))
    want = models.compute_logits(plain, ids, mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(got)[mask == 1],
                               hf_testing.hf_logits(self.hf, ids, mask)[mask == 1], atol=1e-4, rtol=0)

  def test_random_init_is_born_sharded(self):
    cfg = self.plain.config
    model = models.init(cfg, jax.random.key(0), mesh=self.mesh)
    self._assert_sharded(model)
    plain = models.init(cfg, jax.random.key(0))
    for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(plain.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7)

  def test_policy_reference_and_value_on_one_mesh(self):
    policy = self.sharded
    reference = models.from_pretrained(self.path, mesh=self.mesh)
    value = models.value_model(policy)
    for m in (policy, reference, value):
      for leaf in jax.tree.leaves(m.params):
        self.assertIs(leaf.sharding.mesh, self.mesh)
    self.assertEqual(value.params["value_head"]["kernel"].sharding.spec, P("fsdp"))
    ids = jnp.ones((8, 5), jnp.int32)
    self.assertEqual(models.compute_values(value, ids, ids).shape, (8, 5))


if __name__ == "__main__":
  absltest.main()
