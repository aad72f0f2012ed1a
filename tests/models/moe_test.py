"""Mixture-of-experts models: parity with transformers' Qwen3-MoE and Mixtral, the expert
kernels against each other, the router losses against transformers' formula."""
import atexit
import functools
import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from absl.testing import absltest, parameterized

from jaxrl_llm import models
from jaxrl_llm.models import moe
from tests import hf_testing

# Odd settings on purpose: a sparse step with a dense first layer (three runs of layers),
# unnormalised top-k, tied embeddings.
VARIANTS = [
    dict(testcase_name="qwen3_moe", arch="qwen3_moe", norm_topk_prob=True),
    dict(testcase_name="qwen3_moe_sparse_step_dense_first", arch="qwen3_moe", num_hidden_layers=4,
         decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False),
    dict(testcase_name="qwen3_moe_dense_first_tied", arch="qwen3_moe", mlp_only_layers=[0],
         tied=True),
    dict(testcase_name="mixtral", arch="mixtral"),
    dict(testcase_name="mixtral_tied", arch="mixtral", tied=True),
]


def _batch(seed, B=3, T=17):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, hf_testing.TINY["vocab_size"], (B, T))
  mask = np.ones((B, T), np.int64)
  mask[1, :5] = 0  # one left-padded row
  return ids, mask


def _sharp_router(hf, scale=4.0):
  """Scales the routers up so the top-k choice is clear-cut (random tiny routers are nearly
  uniform, where fp32 ties would make a parity test flaky rather than a test of routing)."""
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if name.endswith("mlp.gate.weight"):  # the router [E, D]
        p.mul_(scale / p.std())
  return hf


_TMP = tempfile.mkdtemp(prefix="moe_test_")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


@functools.cache
def _loaded(name):
  """(the transformers model, its directory, our float32 model) of VARIANTS' `name`: built
  once for the file's tests (none of them changes it)."""
  variant = dict(next(v for v in VARIANTS if v["testcase_name"] == name))
  del variant["testcase_name"]
  arch, tied = variant.pop("arch"), variant.pop("tied", False)
  hf = _sharp_router(hf_testing.make_hf_model(arch, tied=tied, **variant))
  path = hf_testing.save_hf_model(hf, os.path.join(_TMP, name))
  return hf, path, models.from_pretrained(path)


@functools.cache
def _hf_greedy(name, prompt, max_new_tokens):
  """transformers' greedy completion of one prompt (no EOS: the whole budget)."""
  hf = _loaded(name)[0]
  with torch.no_grad():
    want = hf.generate(input_ids=torch.tensor([prompt]),
                       attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                       do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None,
                       pad_token_id=0)
  return want[0, len(prompt):].numpy()


NAMES = [(v["testcase_name"], v["testcase_name"]) for v in VARIANTS]


class MoeParityTest(parameterized.TestCase):

  @parameterized.named_parameters(*NAMES)
  def test_float32_logits_match_transformers(self, name):
    hf, _, model = _loaded(name)
    ids, mask = _batch(0)
    want = hf_testing.hf_logits(hf, ids, mask)
    for impl in ("blocked", "ragged"):
      m = model.replace(config=model.config.replace(moe_impl=impl))
      ours = np.asarray(models.compute_logits(m, ids, mask))
      real = mask.astype(bool)
      np.testing.assert_allclose(ours[real], want[real], atol=1e-4, rtol=0, err_msg=impl)

  @parameterized.named_parameters(*NAMES)
  def test_save_then_transformers_loads_the_same_model(self, name):
    hf, _, model = _loaded(name)
    out = self.create_tempdir().full_path
    models.save_pretrained(model, out)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    self.assertEqual(type(reloaded), type(hf))
    self.assertEqual(reloaded.config.to_dict()["num_hidden_layers"], hf.config.num_hidden_layers)
    want, got = hf.state_dict(), reloaded.state_dict()
    self.assertEqual(sorted(want), sorted(got))
    for tensor in want:
      np.testing.assert_array_equal(got[tensor].numpy(), want[tensor].numpy(), err_msg=tensor)
    again = models.from_pretrained(out)
    jax.tree.map(np.testing.assert_array_equal, again.params, model.params)

  @parameterized.named_parameters(NAMES[1], NAMES[3])
  def test_transformers_fused_expert_layout_loads_the_same(self, name):
    hf, _, model = _loaded(name)
    fused = hf_testing.save_hf_model(hf, self.create_tempdir().full_path,
                                     save_original_format=False)  # experts.gate_up_proj
    jax.tree.map(np.testing.assert_array_equal, models.from_pretrained(fused).params,
                 model.params)

  @parameterized.named_parameters(NAMES[1], NAMES[3])
  def test_greedy_decoding_token_for_token(self, name):
    from jaxrl_llm import sampling
    _, _, model = _loaded(name)
    prompts = [[5, 17, 33, 8, 61, 12], [40, 9, 77]]
    for loop, engine in (("scan", "static"), ("unrolled", "static"), ("scan", "continuous")):
      out = sampling.generate(model, prompts, num_samples=1, max_new_tokens=12, temperature=0.0,
                              layer_loop=loop, engine=engine, page_size=8)
      for i, p in enumerate(prompts):
        np.testing.assert_array_equal(np.asarray(out.tokens[i]), _hf_greedy(name, tuple(p), 12),
                                      err_msg=f"{loop} {engine}")
      # The experts of every prompt token and fed-back completion token, the same in both
      # engines (prompts padded to their own widths: compared right-aligned).
      routing = np.asarray(out.routing)
      self.assertEqual(routing.shape[2:], (model.config.num_moe_layers, 2))
      self.assertTrue(np.all(routing[:, -12:-1] >= 0))  # fed back: recorded
      self.assertTrue(np.all(routing[:, -1] == -1))  # the last token is never fed back
      if engine == "static":
        static = routing
      for i, p in enumerate(prompts):
        np.testing.assert_array_equal(routing[i, -12 - len(p):], static[i, -12 - len(p):],
                                      err_msg=f"{loop} {engine}")


class ExpertKernelTest(parameterized.TestCase):

  def test_blocked_and_ragged_equal_a_loop_over_tokens(self):
    N, D, F, E, k = 37, 8, 6, 5, 2
    rng = np.random.RandomState(0)
    x = rng.randn(N, D).astype(np.float32)
    experts = np.stack([rng.choice(E, k, replace=False) for _ in range(N)]).astype(np.int32)
    experts[:20] = [[3, 1]] * 20  # one crowded expert: several blocks of one run
    weights = rng.rand(N, k).astype(np.float32)
    gate_up = rng.randn(E, D, 2, F).astype(np.float32)
    down = rng.randn(E, F, D).astype(np.float32)
    silu = lambda v: v / (1 + np.exp(-v))
    want = np.zeros((N, D), np.float32)
    for n in range(N):
      for j in range(k):
        e = experts[n, j]
        h = silu(x[n] @ gate_up[e, :, 0]) * (x[n] @ gate_up[e, :, 1])
        want[n] += weights[n, j] * (h @ down[e])
    for impl in ("blocked", "ragged", "gmm"):  # gmm in Pallas's interpreter off TPU
      got = jax.jit(functools.partial(moe.expert_ffn, impl=impl, interpret=True))(
          x, experts, weights, gate_up, down)
      np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5, err_msg=impl)

  def test_auto_takes_gmm_on_tpu_blocked_on_cpu(self):
    self.assertEqual(moe.AUTO_IMPL, {"cpu": "blocked", "gpu": "ragged", "tpu": "gmm"})
    self.assertEqual(moe.resolve("auto", None), "blocked")  # these tests' CPU
    self.assertEqual(moe.resolve("gmm", None), "gmm")
    with self.assertRaisesRegex(ValueError, r"moe_impl='megablox': expected one of"):
      models.ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                         num_heads=1, num_kv_heads=1, head_dim=8, moe_impl="megablox")

  def test_blocked_and_gmm_gradients_equal_ragged(self):
    N, D, F, E, k = 29, 8, 6, 4, 2
    keys = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(keys[0], (N, D))
    experts = jax.random.randint(keys[1], (N, k), 0, E)
    weights = jax.random.uniform(keys[2], (N, k))
    gate_up = 0.3 * jax.random.normal(keys[3], (E, D, 2, F))
    down = 0.3 * jax.random.normal(keys[0], (E, F, D))
    # Jitted: one program per kernel rather than one per operation of its backward.
    grads = {impl: jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(moe.expert_ffn(
        *a, impl=impl, interpret=True))), argnums=(0, 2, 3, 4)))(x, experts, weights, gate_up,
                                                                  down)
             for impl in ("blocked", "ragged", "gmm")}
    for impl in ("blocked", "gmm"):
      jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
                   grads[impl], grads["ragged"])


class RouterLossTest(parameterized.TestCase):

  @parameterized.parameters("qwen3_moe", "mixtral")
  def test_aux_loss_equals_transformers(self, arch):
    hf = hf_testing.make_hf_model(arch)
    path = hf_testing.save_hf_model(hf, self.create_tempdir().full_path)
    model = models.from_pretrained(path)
    ids, mask = _batch(2)
    with torch.no_grad():
      out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
               position_ids=torch.tensor(np.maximum(np.cumsum(mask, -1) - 1, 0)),
               output_router_logits=True)
    mask_j = jnp.asarray(mask, jnp.int32)
    _, _, routing = jax.jit(lambda m, ids, mask: models.forward(
        m, ids, models.positions_from_mask(mask), mask, with_router=True))(
            model, jnp.asarray(ids, jnp.int32), mask_j)
    self.assertEqual(routing["experts"].shape, (3, 17, 3, 2))
    np.testing.assert_allclose(float(moe.aux_loss(routing, model.config.num_experts)),
                               float(out.aux_loss), rtol=1e-5)


if __name__ == "__main__":
  absltest.main()
