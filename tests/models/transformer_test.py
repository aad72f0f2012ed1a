"""Parity of our Flax decoder with transformers' PyTorch Llama / Qwen2 / Qwen3."""
import atexit
import copy
import functools
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import torch
from absl.testing import absltest, parameterized

from jaxrl_llm import models
from tests import hf_testing

VARIANTS = [
    dict(testcase_name="llama", arch="llama"),
    dict(testcase_name="llama_tied", arch="llama", tied=True),
    dict(testcase_name="llama3_rope_bias", arch="llama", attention_bias=True, mlp_bias=True,
         rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                              low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=16)),
    dict(testcase_name="qwen2", arch="qwen2"),
    dict(testcase_name="qwen2_tied", arch="qwen2", tied=True),
    dict(testcase_name="qwen3", arch="qwen3"),
    dict(testcase_name="qwen3_tied", arch="qwen3", tied=True),
]


def _random_batch(seed, B=3, T=11, vocab=hf_testing.TINY["vocab_size"]):
  rng = np.random.RandomState(seed)
  return rng.randint(3, vocab, (B, T)), np.ones((B, T), np.int64)


_TMP = tempfile.mkdtemp(prefix="transformer_test_")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


_HF = {}


def _hf(arch, tied=False, **overrides):
  """A tiny transformers model and its directory, built once for the file's tests (none
  changes either)."""
  key = (arch, tied, repr(sorted(overrides.items())))
  if key not in _HF:
    hf = hf_testing.make_hf_model(arch, tied=tied, **overrides)
    _HF[key] = hf, hf_testing.save_hf_model(hf, tempfile.mkdtemp(dir=_TMP))
  return _HF[key]


class ParityTest(parameterized.TestCase):

  def _load(self, arch, tied=False, dtype="float32", **overrides):
    hf, path = _hf(arch, tied, **overrides)
    return hf, path, models.from_pretrained(path, dtype=dtype)

  @parameterized.named_parameters(*VARIANTS)
  def test_float32_logits_match_transformers(self, arch, tied=False, **overrides):
    hf, _, model = self._load(arch, tied, **overrides)
    ids, mask = _random_batch(0, T=40)  # past original_max_position_embeddings of llama3 rope
    ours = np.asarray(models.compute_logits(model, ids, mask))
    self.assertEqual(ours.dtype, np.float32)
    self.assertEqual(ours.shape, (3, 40, hf_testing.TINY["vocab_size"]))
    np.testing.assert_allclose(ours, hf_testing.hf_logits(hf, ids, mask), atol=1e-4, rtol=0)

  @parameterized.named_parameters(
      dict(testcase_name="llama", arch="llama"), dict(testcase_name="qwen2", arch="qwen2"),
      dict(testcase_name="qwen3_tied", arch="qwen3", tied=True))
  def test_bfloat16_within_bf16_tolerance(self, arch, tied=False):
    hf, path, model = self._load(arch, tied, dtype="bfloat16")
    self.assertEqual(model.params["embed"].dtype, jnp.bfloat16)
    ids, mask = _random_batch(1)
    exact = hf_testing.hf_logits(hf, ids, mask)
    ours = np.asarray(models.compute_logits(model, ids, mask))
    theirs = hf_testing.hf_logits(copy.deepcopy(hf).to(torch.bfloat16), ids, mask)
    err_ours, err_theirs = np.abs(ours - exact).max(), np.abs(theirs - exact).max()
    # Both round to bf16 (8 bits of mantissa) in the same places: errors of the same size.
    self.assertLess(err_ours, 2 * err_theirs + 1e-2)
    self.assertLess(err_ours, 0.02 * np.abs(exact).max() + 0.05)
    # A float32 parameter copy computing in bf16 is a supported mix too.
    mixed = models.from_pretrained(path, dtype="bfloat16", param_dtype="float32")
    self.assertEqual(mixed.params["embed"].dtype, jnp.float32)
    err_mixed = np.abs(np.asarray(models.compute_logits(mixed, ids, mask)) - exact).max()
    self.assertLess(err_mixed, 2 * err_theirs + 1e-2)

  @parameterized.named_parameters(
      dict(testcase_name="llama", arch="llama"), dict(testcase_name="qwen3", arch="qwen3"))
  def test_left_padding_does_not_change_real_token_logits(self, arch):
    hf, _, model = self._load(arch)
    rng = np.random.RandomState(2)
    rows = [list(rng.randint(3, 97, n)) for n in (4, 9, 1, 7)]
    ids, mask = hf_testing.left_padded_batch(rows)
    padded = np.asarray(models.compute_logits(model, ids, mask))
    T = ids.shape[1]
    # Each row alone, from position 0, in one call: right-padded to T (the model is causal:
    # the padding after a row changes none of its logits).
    alone_ids = np.asarray([row + [0] * (T - len(row)) for row in rows])
    alone = np.asarray(models.compute_logits(model, alone_ids, np.ones_like(alone_ids)))
    for i, row in enumerate(rows):
      np.testing.assert_allclose(padded[i, T - len(row):], alone[i, :len(row)], atol=2e-5,
                                 rtol=0)
    # ...and they match transformers given padding-aware position ids.
    ref = hf_testing.hf_logits(hf, ids, mask)
    np.testing.assert_allclose(padded[mask == 1], ref[mask == 1], atol=1e-4, rtol=0)

  @parameterized.named_parameters(
      dict(testcase_name="llama", arch="llama"), dict(testcase_name="qwen2_tied", arch="qwen2", tied=True),
      dict(testcase_name="qwen3", arch="qwen3"))
  def test_prefill_then_decode_equals_full_forward(self, arch, tied=False):
    _, _, model = self._load(arch, tied)
    rng = np.random.RandomState(3)
    rows = [list(rng.randint(3, 97, n)) for n in (5, 8)]
    prompt, prompt_mask = hf_testing.left_padded_batch(rows)
    B, S0 = prompt.shape
    new = rng.randint(3, 97, (B, 6))
    full_ids = np.concatenate([prompt, new], 1)
    full_mask = np.concatenate([prompt_mask, np.ones_like(new)], 1)
    full = np.asarray(models.compute_logits(model, full_ids, full_mask))

    S = full_ids.shape[1] + 3  # a cache longer than needed: unused slots must not matter
    kv_mask = jnp.zeros((B, S), jnp.int32).at[:, :S0].set(prompt_mask)
    positions = models.positions_from_mask(jnp.asarray(full_mask))
    forward = jax.jit(models.forward)
    cache = models.init_cache(model.config, B, S)
    logits, cache = forward(model, prompt, positions[:, :S0], kv_mask, cache, 0)
    np.testing.assert_allclose(np.asarray(logits)[prompt_mask == 1], full[:, :S0][prompt_mask == 1],
                               atol=1e-5, rtol=0)
    for t in range(new.shape[1]):
      slot = S0 + t
      kv_mask = kv_mask.at[:, slot].set(1)
      logits, cache = forward(model, new[:, t:t + 1], positions[:, slot:slot + 1], kv_mask, cache,
                              slot)
      np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, slot], atol=1e-5, rtol=0)

  def test_remat_policies_change_the_memory_not_the_gradient(self):
    _, path, _ = self._load("llama")
    ids, mask = _random_batch(4, B=4, T=32)

    def grads(remat):
      model = models.from_pretrained(path, remat=remat)

      def loss(params):
        m = models.Model(params, model.config)
        logits, _ = models.forward(m, ids, models.positions_from_mask(mask), mask)
        return jnp.mean(jax.nn.logsumexp(logits, -1))

      traced = jax.jit(jax.grad(loss)).trace(model.params)  # traced, lowered, compiled once
      compiled = traced.lower().compile()
      temp = compiled.memory_analysis().temp_size_in_bytes
      return compiled(model.params), str(traced.jaxpr), temp

    g_plain, jaxpr_plain, temp_plain = grads("none")
    self.assertNotIn("remat", jaxpr_plain)
    temps = {}
    for policy in ("dots", "full"):
      g, jaxpr, temps[policy] = grads(policy)
      self.assertIn("remat", jaxpr)
      jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6, rtol=1e-5), g, g_plain)
    # Keeping less for the backward pass takes less memory: full < dots < none.
    self.assertLess(temps["full"], temps["dots"])
    self.assertLess(temps["dots"], temp_plain)

  def test_layers_are_one_scanned_block(self):
    """The program holds one layer's code: its size does not grow with depth."""
    def program_size(num_layers):
      hf = hf_testing.make_hf_model("qwen3", num_hidden_layers=num_layers)
      path = hf_testing.save_hf_model(hf, self.create_tempdir().full_path)
      model = models.from_pretrained(path)
      ids, mask = _random_batch(0, B=2, T=8)
      jaxpr = str(jax.make_jaxpr(
          lambda p: models.forward(models.Model(p, model.config), ids, mask, mask))(model.params))
      return jaxpr.count("dot_general"), jaxpr.count("scan[")

    two = program_size(2)
    self.assertEqual(two, program_size(12))
    self.assertEqual(two[1], 1)


class ValueModelTest(absltest.TestCase):

  def test_value_model_shares_the_backbone(self):
    _, path = _hf("qwen2")
    policy = models.from_pretrained(path)
    critic = models.value_model(policy)
    self.assertNotIn("lm_head", critic.params)
    np.testing.assert_array_equal(critic.params["layers"]["mlp"]["gate_up_proj"]["kernel"],
                                  policy.params["layers"]["mlp"]["gate_up_proj"]["kernel"])
    ids, mask = _random_batch(5)
    np.testing.assert_array_equal(models.compute_values(critic, ids, mask), np.zeros(ids.shape))
    # With a head w, the value is w . h where h is the policy's final hidden state.
    w = np.random.RandomState(0).randn(policy.config.hidden_size).astype(np.float32)
    critic.params["value_head"]["kernel"] = w
    critic.params["value_head"]["bias"] = np.float32(0.5)
    hidden, _ = jax.jit(lambda m, ids, mask: models.forward(
        m, ids, models.positions_from_mask(mask), mask, return_hidden=True))(policy, ids, mask)
    np.testing.assert_allclose(models.compute_values(critic, ids, mask),
                               np.asarray(hidden) @ w + 0.5, atol=1e-5)
    with self.assertRaisesRegex(ValueError, "value model"):
      models.compute_values(policy, ids, mask)
    with self.assertRaisesRegex(ValueError, "compute_values"):
      models.compute_logits(critic, ids, mask)


class FrozenCopyTest(parameterized.TestCase):

  @parameterized.parameters("qwen3", "qwen3_moe")
  def test_bf16_frozen_copy_gives_the_same_logits_in_less_memory(self, arch):
    _, path = _hf(arch)
    policy = models.from_pretrained(path, dtype="bfloat16", param_dtype="float32")
    copy = models.frozen(policy)
    ids, mask = _random_batch(6)
    np.testing.assert_array_equal(models.compute_logits(copy, ids, mask),
                                  models.compute_logits(policy, ids, mask))  # bit for bit
    dtypes = jax.tree_util.tree_map_with_path(
        lambda p, x: (jax.tree_util.keystr(p), x.dtype), copy.params)
    for name, dtype in jax.tree.leaves(dtypes, is_leaf=lambda x: isinstance(x, tuple)):
      self.assertEqual(dtype, jnp.float32 if "router" in name else jnp.bfloat16, name)
    nbytes = lambda m: sum(x.nbytes for x in jax.tree.leaves(m.params))
    self.assertLess(nbytes(copy), 0.52 * nbytes(policy))
    # A copy, never an alias: the policy's arrays are donated to the update.
    self.assertFalse(any(a is b for a, b in zip(jax.tree.leaves(copy.params),
                                                jax.tree.leaves(policy.params))))
    # The negative control: the router stored in bf16 would change the routing's logits.
    if arch == "qwen3_moe":
      rounded = jax.tree_util.tree_map_with_path(
          lambda p, x: x.astype(jnp.bfloat16).astype(jnp.float32)
          if "router" in jax.tree_util.keystr(p) else x, policy.params)
      self.assertFalse(np.array_equal(
          models.compute_logits(policy.replace(params=rounded), ids, mask),
          models.compute_logits(policy, ids, mask)))


if __name__ == "__main__":
  absltest.main()
