"""LoRA adapters and the int8 base against PEFT and transformers (PyTorch, float32)."""
import atexit
import functools
import json
import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
import transformers

from jaxrl_llm import models
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import lora, quant
from jaxrl_llm.models.config import LORA_TARGETS
from tests import hf_testing

ROWS = [[5, 9, 13, 2, 44, 7], [11, 3, 8], [60, 61, 62, 63, 1]]


_TMP = tempfile.mkdtemp(prefix="lora_test_")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


@functools.cache
def _base_dir(arch: str) -> str:
  """A tiny random transformers checkpoint of `arch`, written once for the file's tests."""
  return hf_testing.save_hf_model(hf_testing.make_hf_model(arch), os.path.join(_TMP, arch))


def _random_adapters(model: models.Model, seed: int) -> models.Model:
  """The model's adapters with random B (fresh ones are zero and would test nothing)."""
  base, adapters = lora.split(model.params)
  leaves, treedef = jax.tree.flatten(adapters)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  leaves = [x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return model.replace(params=lora.join(base, jax.tree.unflatten(treedef, leaves)))


def _adapted(path: str, targets=LORA_TARGETS, rank: int = 4, alpha: float = 8.0):
  base = models.from_pretrained(path, "float32")
  return _random_adapters(models.with_lora(base, rank, alpha, targets, jax.random.key(1)), 2)


def _logits(model, ids, mask):
  return np.asarray(models.compute_logits(model, ids, mask))


@pytest.mark.parametrize("arch,targets", [
    ("llama", LORA_TARGETS), ("qwen2", ("qkv_proj", "down_proj")), ("qwen3", LORA_TARGETS)])
def test_peft_loads_the_adapter_and_matches(tmp_path, arch, targets):
  base_dir = _base_dir(arch)
  model = _adapted(base_dir, targets)
  ids, mask = hf_testing.left_padded_batch(ROWS)
  ours = _logits(model, ids, mask)
  # The adapters change the model (else the test could not fail) ...
  assert np.abs(ours - _logits(models.merged(model.replace(params=lora.split(model.params)[0],
                                                           config=model.config.without_lora())),
                               ids, mask)).max() > 1e-2
  models.save_adapter(model, str(tmp_path / "adapter"), base_dir)
  config = json.load(open(tmp_path / "adapter" / lora.PEFT_CONFIG_FILE))
  assert config["base_model_name_or_path"] == base_dir and config["r"] == 4
  peft_model = peft.PeftModel.from_pretrained(
      transformers.AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32),
      str(tmp_path / "adapter")).eval()
  real = mask.astype(bool)  # the logits of padding slots mean nothing
  np.testing.assert_allclose(hf_testing.hf_logits(peft_model, ids, mask)[real], ours[real],
                             atol=1e-4, rtol=0)
  # ... and the merged export is the same model for transformers alone.
  models.save_pretrained(model, str(tmp_path / "export"))
  merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"),
                                                             torch_dtype=torch.float32).eval()
  np.testing.assert_allclose(hf_testing.hf_logits(merged, ids, mask)[real], ours[real],
                             atol=1e-4, rtol=0)


def test_peft_module_names_cover_every_layer():
  model = _adapted(_base_dir("llama"), ("qkv_proj", "gate_up_proj"))
  names = {n for n, _ in lora.peft_tensors(lora.split(model.params)[1], model.config)}
  expected = {f"base_model.model.model.layers.{i}.{m}.lora_{ab}.weight"
              for i in range(3) for m in ("self_attn.q_proj", "self_attn.k_proj",
                                          "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
              for ab in "AB"}
  assert names == expected


def test_fresh_adapters_change_nothing_and_the_forward_is_the_merged_one():
  base = models.from_pretrained(_base_dir("qwen3"), "float32")
  # test_peft_loads_the_adapter_and_matches[qwen3]'s adapters (rank 4, alpha 8): its programs.
  fresh = models.with_lora(base, 4, 8, LORA_TARGETS, jax.random.key(0))
  ids, mask = hf_testing.left_padded_batch(ROWS)
  np.testing.assert_array_equal(_logits(fresh, ids, mask), _logits(base, ids, mask))
  adapted = _random_adapters(fresh, 3)
  np.testing.assert_allclose(_logits(models.merged(adapted), ids, mask),
                             _logits(adapted, ids, mask), atol=2e-5)


def test_int8_base_is_close_half_the_bytes_of_bf16_and_merges():
  base = models.from_pretrained(_base_dir("llama"), "float32")
  q = models.quantize_base(base)
  kernel = q.params["layers"]["attn"]["qkv_proj"]
  assert kernel["kernel"].dtype == jnp.int8 and kernel[quant.SCALE].shape == (3, 1, 2, 4, 10)
  ids, mask = hf_testing.left_padded_batch(ROWS)
  full, q8 = _logits(base, ids, mask), _logits(q, ids, mask)
  assert 0 < np.abs(full - q8).max() < 0.05 * np.abs(full).max()
  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), base.params)
  b16, b8 = quant.quantized_bytes(bf16)["projections"], quant.quantized_bytes(q.params)["projections"]
  assert b8 < 0.6 * b16, (b8, b16)
  # An adapted int8 model merges into a float model with the same outputs.
  adapted = _random_adapters(models.with_lora(q, 4, 8, LORA_TARGETS, jax.random.key(0)), 4)
  np.testing.assert_allclose(_logits(models.merged(adapted), ids, mask),
                             _logits(adapted, ids, mask), atol=2e-5)


def test_int8_base_in_bf16_compute():
  base = models.from_pretrained(_base_dir("qwen2"), "bfloat16", param_dtype="float32")
  q = models.quantize_base(base)
  ids, mask = hf_testing.left_padded_batch(ROWS)
  out = _logits(models.with_lora(q, 4, 8, ("qkv_proj",), jax.random.key(0)), ids, mask)
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out, _logits(base, ids, mask), atol=0.1 * np.abs(out).max())


@pytest.mark.mesh  # sharded over 8 devices (on one, the sharding would be no sharding)
def test_fingerprint_is_the_same_for_any_sharding_and_sees_one_value():
  base = models.from_pretrained(_base_dir("llama"), "float32")
  n = len(jax.devices())
  mesh = sh.make_mesh(dict(data=1, fsdp=n, tensor=1))
  placed = models.place(base, mesh)
  assert lora.fingerprint(base.params) == lora.fingerprint(placed.params)
  changed = jax.tree.map(np.copy, base.params)
  changed["layers"]["mlp"]["down_proj"]["kernel"][1, 3, 5] += 1e-6
  assert lora.fingerprint(changed) != lora.fingerprint(base.params)


def test_dropout_applies_only_with_a_key():
  base = models.from_pretrained(_base_dir("llama"), "float32")
  model = _random_adapters(models.with_lora(base, 4, 8, LORA_TARGETS, jax.random.key(0),
                                            dropout=0.5), 1)
  ids, mask = hf_testing.left_padded_batch(ROWS)
  ids, mask = jnp.asarray(ids), jnp.asarray(mask)
  pos = models.positions_from_mask(mask)
  forward = jax.jit(lambda m, rng: models.forward(m, ids, pos, mask, dropout_rng=rng)[0])
  plain = forward(model, None)
  np.testing.assert_allclose(plain, _logits(model, ids, mask), atol=1e-6)
  dropped = forward(model, jax.random.key(5))
  assert np.abs(np.asarray(dropped) - np.asarray(plain)).max() > 1e-3


def test_bad_lora_configs_name_the_field():
  base = dict(vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2,
              num_kv_heads=1, head_dim=4)
  with pytest.raises(ValueError, match="lora_targets"):
    models.ModelConfig(**base, lora_rank=4, lora_targets=("q_proj",))
  with pytest.raises(ValueError, match="lora_targets"):
    models.ModelConfig(**base, lora_rank=4)
  with pytest.raises(ValueError, match="base_quant"):
    models.ModelConfig(**base, base_quant="nf4")
  with pytest.raises(ValueError, match="experts carry no adapters"):
    models.ModelConfig(**dict(base, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                              moe_intermediate_size=8), lora_rank=2, lora_targets=("down_proj",))
