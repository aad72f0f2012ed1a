"""Context parallelism (`config.mesh.context`): with the sequence of the activations split
over 2 or 4 of the 8 CPU devices, the forward's logits and the gradients of the update's
completion log-probs equal one device's (float32, 1e-5), with left padding and rows of
mixed lengths, a sequence the context size does not divide included; a GRPO run logs the
metrics of context=1; and a mesh the context size does not fit is refused by name."""
from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized
from jax.experimental import topologies

from configs import grpo_arithmetic, smoke
from jaxrl_llm import config as config_lib
from jaxrl_llm import models, training
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import attention
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.sampling.sampler import Sampler
from jaxrl_llm.sampling.settings import SamplingSettings
from jaxrl_llm.training import steps
from jaxrl_llm.training.rollouts.train_batch import TrainBatch
from tests.training.run_logs import assert_rows_close, read_jsonl

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
MESHES = {"context2": dict(data=2, fsdp=2, context=2, tensor=1),
          "context4": dict(data=1, fsdp=2, context=4, tensor=1)}


def _rows(lengths, T, seed=0):
  """Random tokens [B, T], left-padded to the rows' `lengths`, and their mask."""
  tokens = jax.random.randint(jax.random.key(seed), (len(lengths), T), 1, CFG.vocab_size)
  mask = (np.arange(T)[None, :] >= T - np.asarray(lengths)[:, None]).astype(np.int32)
  return np.asarray(tokens, np.int32) * mask, mask


@jax.jit
def _logits(model, tokens, mask):
  return models.forward(model, tokens, models.positions_from_mask(mask), mask)[0]


@jax.jit
def _logp_grads(model, batch):
  """The gradient of the masked completion log-probs' sum, through the update's own path
  (`steps.completion_logp`: the padding to the context size, chunked log-probs)."""
  def loss(params):
    logp, _ = steps.completion_logp(model.replace(params=params), batch, temperature=1.0,
                                    chunk_size=4)
    return jnp.sum(logp * batch.loss_mask)
  return jax.grad(loss)(model.params)


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16], [17], [18, 19, 20], [21]]


def _settings(engine):
  return SamplingSettings(num_samples=2, max_new_tokens=6, temperature=1.0, engine=engine,
                          slots=8)


class ContextParallelTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = models.init(CFG, jax.random.key(0))  # one device, no mesh
    cls.one_device_samples = {}  # engine: the one-device sampler's output (both meshes')

  @parameterized.named_parameters((name, name) for name in MESHES)
  @pytest.mark.mesh
  def test_logits_equal_one_device(self, mesh_name):
    tokens, mask = _rows([16, 11, 7, 3], 16)
    mesh = sh.make_mesh(MESHES[mesh_name])
    got = _logits(models.place(self.model, mesh), tokens, mask)
    self.assertEqual(got.sharding.spec[1], "context")  # the sequence is split
    np.testing.assert_allclose(got, _logits(self.model, tokens, mask), rtol=1e-5, atol=1e-5)

  @parameterized.named_parameters((name, name) for name in MESHES)
  @pytest.mark.mesh
  def test_logp_gradients_equal_one_device(self, mesh_name):
    # 7 prompt + 6 completion slots (13: padded to 14 or 16), every prompt at least one token.
    tokens, mask = _rows([13, 11, 9, 7], 13)
    loss_mask = mask[:, 7:] * (np.arange(6)[None, :] < np.asarray([[6], [4], [5], [2]]))
    batch = TrainBatch(tokens, mask, loss_mask.astype(np.int32))
    mesh = sh.make_mesh(MESHES[mesh_name])
    got = _logp_grads(models.place(self.model, mesh), batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got,
                 _logp_grads(self.model, batch))

  @parameterized.product(mesh_name=tuple(MESHES), engine=("static", "continuous"))
  @pytest.mark.mesh
  def test_the_sampler_splits_rows_over_the_context_devices(self, mesh_name, engine):
    """A decode step has one token per row: the context devices take rows of their own (the
    KV buffers split over them too, not repeated) and sample one device's tokens."""
    mesh = sh.make_mesh(MESHES[mesh_name])
    sampler = Sampler(_settings(engine))
    got = sampler(models.place(self.model, mesh), PROMPTS, seed=3)
    if engine not in self.one_device_samples:
      self.one_device_samples[engine] = Sampler(_settings(engine))(self.model, PROMPTS, seed=3)
    want = self.one_device_samples[engine]
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-5)
    trainer_rows = sh.logical_to_spec((sh.BATCH,), (16,), mesh, sh.DEFAULT_RULES)[0]
    self.assertEqual(got.tokens.sharding.spec[0], trainer_rows)  # where the trainer wants them
    cache = jax.tree.leaves(sampler.cache)[0]
    self.assertIn("context", jax.tree.leaves(tuple(cache.sharding.spec)))
    self.assertEqual(sh.sampling_rules(mesh, sh.DEFAULT_RULES)[0],
                     (sh.BATCH, ("data", "fsdp", "expert", "context")))

  @pytest.mark.mesh
  def test_seq_shards(self):
    mesh = sh.make_mesh(MESHES["context4"])
    self.assertEqual(sh.seq_shards(mesh, sh.DEFAULT_RULES), 4)
    self.assertEqual(sh.seq_shards(None, None), 1)
    self.assertEqual(sh.logical_to_spec((sh.BATCH, sh.SEQ), (4, 6), mesh, sh.DEFAULT_RULES),
                     jax.sharding.PartitionSpec("fsdp", None))  # 6 does not split: whole
    self.assertEqual(attention.sequence_multiple(mesh, sh.DEFAULT_RULES), 4)

  @absltest.skipUnless(importlib.util.find_spec("libtpu"), "needs the TPU compiler")
  def test_a_tpu_pads_each_context_piece_to_whole_splash_blocks(self):
    """On a TPU each piece is padded to 128-token blocks, so 'auto' runs splash per piece
    (a 4,480-token row over 2 pieces of 2,240 would fall back to blockwise)."""
    chips = topologies.get_topology_desc(platform="tpu", topology_name="v5p:2x2x1").devices
    mesh = sh.make_mesh(dict(data=2, fsdp=1, context=2, tensor=1), list(chips))
    unit = attention.sequence_multiple(mesh, sh.DEFAULT_RULES)
    self.assertEqual(unit, 256)
    T = 4480 + -4480 % unit
    self.assertEqual(attention.resolve("auto", where="tpu", dtype=jnp.bfloat16, head_dim=128,
                                       length=T, seq_shards=2), "splash")


@pytest.mark.mesh  # the messages count the 8 devices
class ContextConfigTest(absltest.TestCase):

  def test_a_context_size_the_devices_do_not_fit_is_refused(self):
    config = smoke.get_config()
    config.mesh.context = 3
    with self.assertRaisesRegex(config_lib.ConfigError,
                                r"config.mesh \(data=-1, fsdp=1, expert=1, context=3, tensor=1\): "
                                r"the other axes \(3 devices\) do not divide the 8 devices"):
      config_lib.validate(config)

  def test_a_context_axis_the_rules_do_not_use_is_refused(self):
    config = smoke.get_config()
    config.mesh.context = 2
    config.mesh.rules = tuple((name, None if name == "seq" else axes)
                              for name, axes in config.mesh.rules)
    with self.assertRaisesRegex(config_lib.ConfigError,
                                r"config.mesh.context=2 splits the sequence, but config.mesh.rules "
                                r"maps 'seq' to None: expected 'context' among its mesh axes"):
      config_lib.validate(config)


@pytest.mark.mesh
@pytest.mark.slow
class ContextParallelRunTest(absltest.TestCase):

  def test_grpo_logs_the_metrics_of_one_context_device(self):
    rows = {}
    for context in (1, 2):
      config = grpo_arithmetic.get_config("runlocal")
      config.mesh.context = context
      workdir = self.create_tempdir().full_path
      training.train(config, workdir, devices=jax.devices()[:4])
      rows[context] = read_jsonl(workdir)
    self.assertLen(rows[2], len(rows[1]))
    assert_rows_close(rows[2], rows[1], rtol=1e-4, atol=1e-4)


if __name__ == "__main__":
  absltest.main()
