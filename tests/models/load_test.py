"""Hugging Face checkpoints in and out, and the errors bad checkpoints get."""
import json
import os

import numpy as np
import safetensors.numpy
import torch
import transformers
from absl.testing import absltest, parameterized

from jaxrl_llm import models
from jaxrl_llm.models import config as model_config
from tests import hf_testing


def _ids(seed=0, B=2, T=9):
  rng = np.random.RandomState(seed)
  return rng.randint(3, 97, (B, T)), np.ones((B, T), np.int64)


class RoundTripTest(parameterized.TestCase):

  @parameterized.named_parameters(
      dict(testcase_name="llama", arch="llama"),
      dict(testcase_name="llama_tied_bias", arch="llama", tied=True, attention_bias=True),
      dict(testcase_name="qwen2", arch="qwen2"),
      dict(testcase_name="qwen3_tied", arch="qwen3", tied=True))
  def test_save_then_transformers_loads_the_same_model(self, arch, tied=False, **overrides):
    hf = hf_testing.make_hf_model(arch, tied=tied, **overrides)
    src = hf_testing.save_hf_model(hf, self.create_tempdir().full_path)
    model = models.from_pretrained(src)
    # Change the weights, so a reload of the *original* files would be caught.
    model.params["final_norm"]["scale"] = model.params["final_norm"]["scale"] * 1.5
    dst = self.create_tempdir().full_path
    models.save_pretrained(model, dst)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(dst).eval()
    self.assertIsInstance(reloaded, type(hf))
    ids, mask = _ids()
    ours = np.asarray(models.compute_logits(model, ids, mask))
    np.testing.assert_allclose(hf_testing.hf_logits(reloaded, ids, mask), ours, atol=1e-4, rtol=0)
    self.assertGreater(np.abs(hf_testing.hf_logits(hf, ids, mask) - ours).max(), 1e-3)
    # And our own loader reads our files back exactly.
    again = models.from_pretrained(dst)
    self.assertEqual(again.config, model.config)
    np.testing.assert_array_equal(np.asarray(models.compute_logits(again, ids, mask)), ours)

  def test_sharded_checkpoints_both_ways(self):
    hf = hf_testing.make_hf_model("qwen2")
    src = hf_testing.save_hf_model(hf, self.create_tempdir().full_path, max_shard_size="20KB")
    self.assertTrue(os.path.exists(os.path.join(src, "model.safetensors.index.json")))
    model = models.from_pretrained(src)
    ids, mask = _ids(1)
    np.testing.assert_allclose(models.compute_logits(model, ids, mask),
                               hf_testing.hf_logits(hf, ids, mask), atol=1e-4, rtol=0)
    dst = self.create_tempdir().full_path
    models.save_pretrained(model, dst, max_shard_bytes=30_000)
    files = sorted(f for f in os.listdir(dst) if f.endswith(".safetensors"))
    self.assertGreater(len(files), 1)
    self.assertNotIn("model.safetensors", files)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(dst).eval()
    np.testing.assert_allclose(hf_testing.hf_logits(reloaded, ids, mask),
                               hf_testing.hf_logits(hf, ids, mask), atol=1e-5, rtol=0)
    # Saving again unsharded replaces the shards instead of leaving them beside the new file.
    models.save_pretrained(model, dst)
    self.assertEqual(sorted(f for f in os.listdir(dst) if "safetensors" in f), ["model.safetensors"])

  def test_bfloat16_checkpoint_loads_as_float32(self):
    hf = hf_testing.make_hf_model("llama").to(dtype=torch.bfloat16)
    path = hf_testing.save_hf_model(hf, self.create_tempdir().full_path)
    model = models.from_pretrained(path, dtype="float32")
    self.assertEqual(model.params["embed"].dtype, np.float32)
    np.testing.assert_array_equal(model.params["embed"],
                                  hf.model.embed_tokens.weight.detach().float().numpy())

  def test_config_round_trip_keeps_rope_scaling(self):
    hf = hf_testing.make_hf_model("llama", rope_parameters=dict(
        rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))
    path = hf_testing.save_hf_model(hf, self.create_tempdir().full_path)
    cfg = models.from_pretrained(path).config
    self.assertEqual(cfg.rope_theta, 5e5)
    self.assertEqual(cfg.rope_params["rope_type"], "llama3")
    self.assertEqual(model_config.from_hf_dict(model_config.to_hf_dict(cfg)), cfg)

  def test_legacy_config_layout(self):
    legacy = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
              "num_hidden_layers": 1, "num_attention_heads": 2, "rope_theta": 1234.0,
              "rope_scaling": {"type": "linear", "factor": 2.0}}
    cfg = model_config.from_hf_dict(legacy)
    self.assertEqual((cfg.rope_theta, cfg.rope_params), (1234.0, {"rope_type": "linear", "factor": 2.0}))
    self.assertEqual((cfg.num_kv_heads, cfg.head_dim), (2, 4))


class BadInputTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.path = hf_testing.save_hf_model(hf_testing.make_hf_model("llama"),
                                         self.create_tempdir().full_path)

  def test_missing_directory(self):
    with self.assertRaisesRegex(FileNotFoundError, "no/such/dir.*not a directory"):
      models.from_pretrained("/no/such/dir")

  def test_missing_config(self):
    os.remove(os.path.join(self.path, "config.json"))
    with self.assertRaisesRegex(FileNotFoundError, "no config.json"):
      models.from_pretrained(self.path)

  def test_missing_weights(self):
    os.remove(os.path.join(self.path, "model.safetensors"))
    with self.assertRaisesRegex(FileNotFoundError, "expected model.safetensors or model.safetensors.index.json"):
      models.from_pretrained(self.path)

  def test_unsupported_model_type_lists_the_supported(self):
    with open(os.path.join(self.path, "config.json")) as f:
      cfg = json.load(f)
    cfg["model_type"] = "gpt2"
    with open(os.path.join(self.path, "config.json"), "w") as f:
      json.dump(cfg, f)
    with self.assertRaisesRegex(ValueError, r"model_type='gpt2'.*\['llama', 'qwen2', 'qwen3', 'qwen3_moe', 'mixtral'\]"):
      models.from_pretrained(self.path)

  def test_tensor_shape_mismatch_names_the_tensor(self):
    file = os.path.join(self.path, "model.safetensors")
    tensors = safetensors.numpy.load_file(file)
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((71, 40), np.float32)
    safetensors.numpy.save_file(tensors, file)
    with self.assertRaisesRegex(ValueError, r"model.layers.1.mlp.up_proj.weight.*\[71, 40\].*\[72, 40\]"):
      models.from_pretrained(self.path)

  def test_missing_tensor_names_it(self):
    file = os.path.join(self.path, "model.safetensors")
    tensors = safetensors.numpy.load_file(file)
    del tensors["model.layers.2.self_attn.k_proj.weight"]
    safetensors.numpy.save_file(tensors, file)
    with self.assertRaisesRegex(ValueError, "no tensor 'model.layers.2.self_attn.k_proj.weight'"):
      models.from_pretrained(self.path)

  def test_unknown_dtype(self):
    with self.assertRaisesRegex(ValueError, r"dtype='fp32'.*\['float32', 'bfloat16', 'float16'\]"):
      models.from_pretrained(self.path, dtype="fp32")

  def test_bad_input_ids(self):
    model = models.from_pretrained(self.path)
    with self.assertRaisesRegex(ValueError, "integer token ids"):
      models.compute_logits(model, np.zeros((1, 3), np.float32), np.ones((1, 3)))
    with self.assertRaisesRegex(ValueError, r"must both be \[batch, length\]"):
      models.compute_logits(model, np.zeros((1, 3), np.int32), np.ones((1, 4)))


if __name__ == "__main__":
  absltest.main()
