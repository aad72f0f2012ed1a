"""The group sampler against transformers' generate, the model's own distribution, and itself."""
import functools
import re
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import torch
from absl.testing import absltest, parameterized

from jaxrl_llm import models, platform, sampling
from jaxrl_llm import sharding as sh
from tests import hf_testing

pytestmark = pytest.mark.slow_file(
    "the sampler against transformers' generate for three architectures, its distribution "
    "(6,000 draws), truncation, stopping, buckets, bf16 and meshes: each setting its own "
    "compiled sampler")

V = hf_testing.TINY["vocab_size"]
EOS = hf_testing.TINY["eos_token_id"]


def _prompts(seed, lengths):
  rng = np.random.RandomState(seed)
  return [list(rng.randint(3, V, n)) for n in lengths]


@functools.cache  # one model per architecture for the module's tests (none changes it)
def _model(arch="llama", **kw):
  hf = hf_testing.make_hf_model(arch, **kw)
  return hf, models.from_pretrained(hf_testing.save_hf_model(hf, tempfile.mkdtemp()))


def _completion_logp(model, prompt, completion, temperature=1.0, length=64):
  """log_softmax(logits / T) of each completion token and the full rows, by one forward pass.

  The tokens are right-padded to `length` columns (causal attention: the padding after them
  changes none of their logits), so that every row compiles the same program."""
  tokens = list(prompt) + list(completion)
  ids = np.zeros((1, max(length, len(tokens))), np.int32)
  ids[0, :len(tokens)] = tokens
  logits = np.asarray(models.compute_logits(model, ids, np.ones_like(ids)))[0, :len(tokens)]
  logits = logits[len(prompt) - 1:-1].astype(np.float64) / temperature  # the logits that chose each completion token
  logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  return logp[np.arange(len(completion)), completion], logp


def _chi2_p_value(counts, expected):
  """Chi-square over bins with >= 5 expected draws, the rest pooled into one bin."""
  big = expected >= 5
  obs, exp = counts[big], expected[big]
  if (~big).any():
    obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
  return scipy.stats.chisquare(obs, exp * obs.sum() / exp.sum())[1]


GREEDY = dict(num_samples=1, max_new_tokens=32, temperature=0.0, eos_ids=(EOS,), pad_id=0)


class GreedyTest(parameterized.TestCase):

  @parameterized.parameters("llama", "qwen2", "qwen3")
  def test_greedy_matches_transformers_generate(self, arch):
    hf, model = _model(arch)
    prompts = _prompts(0, (5, 11, 8))
    out = sampling.generate(model, prompts, **GREEDY)
    for i, p in enumerate(prompts):
      with torch.no_grad():
        ref = hf.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                          do_sample=False, max_new_tokens=32, eos_token_id=EOS, pad_token_id=0)
      ref = ref[0, len(p):].numpy()
      n = int(out.lengths[i])
      self.assertGreater(n, 0)
      np.testing.assert_array_equal(np.asarray(out.tokens[i, :n]), ref[:n])
      if n < 32:  # stopped at an EOS, as transformers did
        self.assertEqual(int(out.tokens[i, n - 1]), EOS)
        self.assertTrue(np.all(ref[n:] == 0))

  def test_greedy_ignores_padding_and_batch_neighbours(self):
    """The target (the second prompt of the test above, among short neighbours in the
    smallest bucket: the qwen3 case's program, kept by `generate`) again beside a long
    neighbour, which moves it to another bucket with a lot of left padding."""
    _, model = _model("qwen3")
    prompts = _prompts(0, (5, 11, 8))
    first = sampling.generate(model, prompts, **GREEDY)
    crowd = sampling.generate(model, _prompts(2, (40, 3)) + prompts[1:2], **GREEDY)
    self.assertEqual(int(first.lengths[1]), 32)  # no EOS: all 32 tokens compared
    np.testing.assert_array_equal(np.asarray(first.tokens[1]), np.asarray(crowd.tokens[2]))
    np.testing.assert_allclose(np.asarray(first.logprobs[1]), np.asarray(crowd.logprobs[2]), atol=1e-5)


class DistributionTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf, cls.model = _model("llama")

  # Compiled with XLA's defaults: with XLA:CPU's elemental emitters (the suite's cheapest
  # compiles, tests/conftest.py) choose._argmax_rows found no entry equal to its row's
  # maximum in 55 of these 6,000 rows at T = 1.7 and drew the out-of-vocabulary id V.
  @parameterized.parameters(1.0, 1.7)
  @pytest.mark.optimized
  def test_first_token_follows_the_softmax(self, temperature):
    prompt = _prompts(3, (7,))[0]
    n = 6000
    out = sampling.generate(self.model, [prompt], num_samples=n, max_new_tokens=1,
                            temperature=temperature, seed=11)
    _, logp = _completion_logp(self.model, prompt, [0], temperature)
    expected = np.exp(logp[0]) * n
    counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=V)
    self.assertGreater(_chi2_p_value(counts, expected), 1e-3)
    # ...and a wrong temperature is rejected by the same test (the test can fail; half the
    # temperature: the near-uniform rows of a random model at 2x barely differ).
    _, wrong = _completion_logp(self.model, prompt, [0], temperature / 2)
    self.assertLess(_chi2_p_value(counts, np.exp(wrong[0]) * n), 1e-3)

  @parameterized.named_parameters(dict(testcase_name="top_k", top_k=4, top_p=1.0),
                                  dict(testcase_name="top_p", top_k=0, top_p=0.6),
                                  dict(testcase_name="both", top_k=8, top_p=0.7))
  def test_truncation_never_leaves_the_kept_set(self, top_k, top_p):
    """...and the sampled log-probs are those of a fresh forward pass over the completion
    (of the tempered distribution before truncation)."""
    prompts = _prompts(5, (4, 10))
    # A low temperature makes the random model's distribution peaked: small kept sets.
    out = sampling.generate(self.model, prompts, num_samples=16, max_new_tokens=8,
                            temperature=0.25, top_k=top_k, top_p=top_p, seed=7)
    sizes = []
    for row in range(32):
      n = int(out.lengths[row])
      completion = np.asarray(out.tokens[row])
      want, logp = _completion_logp(self.model, prompts[row // 16], completion, 0.25)
      np.testing.assert_allclose(np.asarray(out.logprobs[row, :n]), want[:n], atol=1e-4)
      self.assertTrue(np.all(np.asarray(out.logprobs[row, n:]) == 0))
      for t, token in enumerate(completion):
        order = np.argsort(-logp[t])
        kept = order[:top_k] if top_k else order
        probs = np.exp(logp[t][kept]) / np.exp(logp[t][kept]).sum()
        nucleus = kept[:np.searchsorted(np.cumsum(probs), top_p - 1e-6) + 1]
        self.assertIn(token, nucleus, f"row {row} step {t}")
        sizes.append(len(nucleus))
    self.assertLess(np.mean(sizes), V / 4)  # the kept sets really are small


class GumbelMaxTest(absltest.TestCase):

  def test_noise_reaches_far_into_the_upper_tail(self):
    g = np.asarray(sampling.gumbel_noise(jax.random.key(0), (1_000_000,)), np.float64)
    # Gumbel(0, 1): mean = Euler's gamma, CDF exp(-exp(-x)).
    self.assertAlmostEqual(g.mean(), 0.5772, delta=0.005)
    self.assertGreater(scipy.stats.kstest(g, lambda x: np.exp(-np.exp(-x))).pvalue, 1e-3)
    # The smallest 32-bit draw maps to -log(2^-33) = 22.87, not to 23-bit uniforms' 16.6.
    np.testing.assert_allclose(-np.log(-np.log1p(-(0.5 * 2.0 ** -32))), 22.87, atol=0.01)
    self.assertTrue(np.all(np.isfinite(g)))

  @pytest.mark.optimized  # 80 draws over [64, 151936] logits: XLA's optimisations pay
  @pytest.mark.slow("80 draws of 64 rows over a 151,936-token vocabulary (a Qwen-sized one is "
                    "the property), compiled optimised")
  def test_rare_tokens_at_the_top_of_a_151936_token_vocabulary(self):
    """Tokens of probability 1e-8 (at T = 1) at the end of a Qwen-sized vocabulary, raised
    by temperature 2.5 to a measurable rate: drawn as often as softmax(logits / T) says."""
    V, rare = 151_936, 100
    logits = np.full(V, -30.0, np.float32)  # the bulk: 9e-14 each at T = 1
    logits[0] = 0.0
    logits[-rare:] = np.log(1e-8)  # the rare tokens: 1e-8 each at T = 1, at the CDF's top
    settings = sampling.SamplingSettings(1, 1, temperature=2.5)
    p = np.exp(logits.astype(np.float64) / 2.5)
    p /= p.sum()
    draw = jax.jit(lambda key: sampling.choose_tokens(jnp.broadcast_to(logits, (64, V)),
                                                      jax.random.split(key, 64), settings)[0])
    tokens = np.concatenate([np.asarray(draw(jax.random.key(i))) for i in range(80)])
    n = len(tokens)
    for name, members, want in (("token 0", tokens == 0, p[0]),
                                ("the rare tokens", tokens >= V - rare, p[-rare:].sum()),
                                ("the bulk", (tokens > 0) & (tokens < V - rare),
                                 p[1:V - rare].sum())):
      sigma = np.sqrt(n * want * (1 - want))
      self.assertLess(abs(members.sum() - n * want), 4.5 * sigma, f"{name}: {members.sum()} "
                      f"of {n} draws, expected {n * want:.1f}")
    self.assertGreater(n * p[-rare:].sum(), 100)  # the rare set is measured, not empty


class StoppingTest(absltest.TestCase):

  def test_eos_stops_and_masks_the_rest(self):
    hf, model = _model("qwen2")
    prompts = _prompts(6, (5, 7))
    # Many stop ids, so most rows stop early at different steps.
    eos = tuple(range(3, 10))
    out = sampling.generate(model, prompts, num_samples=8, max_new_tokens=10, eos_ids=eos,
                            seed=3, pad_id=0)
    tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)
    stopped = 0
    for row in range(16):
      hits = np.flatnonzero(np.isin(tokens[row], eos))
      if len(hits):
        end = hits[0] + 1
        stopped += 1
        self.assertFalse(bool(out.truncated[row]))
      else:
        end = 10
        self.assertTrue(bool(out.truncated[row]))
      self.assertEqual(int(out.lengths[row]), end)
      np.testing.assert_array_equal(mask[row], (np.arange(10) < end).astype(np.int32))
      self.assertTrue(np.all(tokens[row, end:] == 0))
    self.assertGreater(stopped, 4)
    self.assertLess(stopped, 16)

  def test_rows_are_prompt_major_and_samples_differ(self):
    _, model = _model("llama")
    prompts = _prompts(7, (4, 4))
    out = sampling.generate(model, prompts, num_samples=4, max_new_tokens=6, seed=1)
    self.assertEqual(out.tokens.shape, (8, 6))
    self.assertEqual(out.tokens.dtype, np.int32)
    self.assertEqual(out.logprobs.dtype, np.float32)
    self.assertGreater(len({tuple(np.asarray(r)) for r in out.tokens}), 4)
    # Row 5 is sample 1 of prompt 1: its log-probs are those of prompt 1.
    want, _ = _completion_logp(model, prompts[1], np.asarray(out.tokens[5]))
    np.testing.assert_allclose(np.asarray(out.logprobs[5]), want, atol=1e-4)
    again = sampling.generate(model, prompts, num_samples=4, max_new_tokens=6, seed=1)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(again.tokens))
    other = sampling.generate(model, prompts, num_samples=4, max_new_tokens=6, seed=2)
    self.assertFalse(np.array_equal(np.asarray(out.tokens), np.asarray(other.tokens)))


class CompilationTest(absltest.TestCase):

  def test_prompt_lengths_inside_a_bucket_compile_once(self):
    """(The settings and bucket of StoppingTest's second test: its program, from the
    session's compilation cache.)"""
    _, model = _model("llama")
    sampler = sampling.Sampler(sampling.SamplingSettings(num_samples=4, max_new_tokens=6))
    for i, n in enumerate(range(7, 17)):  # all inside bucket 16
      out = sampler(model, _prompts(i, (n, n - 5)), seed=i)
      self.assertEqual(out.tokens.shape, (8, 6))
    self.assertEqual(sampler.num_compilations(), 1)
    sampler(model, _prompts(0, (20,)), seed=0)  # bucket 32: a second program
    self.assertEqual(sampler.num_compilations(), 2)

  def test_bucket_length(self):
    self.assertEqual(sampling.bucket_length(17, (16, 32, 64)), 32)
    self.assertEqual(sampling.bucket_length(16, (16, 32, 64)), 16)
    self.assertEqual(sampling.bucket_length(65, (16, 32, 64)), 128)


@pytest.mark.mesh
class ShardedSamplingTest(absltest.TestCase):

  def test_sharded_model_samples_the_same(self):
    hf = hf_testing.make_hf_model("qwen2", vocab_size=128, hidden_size=64, intermediate_size=96)
    path = hf_testing.save_hf_model(hf, tempfile.mkdtemp())
    mesh = sh.make_mesh(dict(data=2, fsdp=2, tensor=2))
    plain, sharded = models.from_pretrained(path), models.from_pretrained(path, mesh=mesh)
    prompts = _prompts(8, (5, 9, 3, 12))
    kw = dict(num_samples=2, max_new_tokens=10, temperature=0.0)
    a = sampling.generate(plain, prompts, **kw)
    b = sampling.generate(sharded, prompts, **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
    self.assertEqual(len(b.tokens.sharding.device_set), 8)


class LayerLoopTest(parameterized.TestCase):
  """Scanned and unrolled layers sample the same completions (sampling.SamplingSettings)."""

  def _scan_and_unrolled_sample_the_same(self, mesh_shape):
    hf = hf_testing.make_hf_model("qwen3", vocab_size=128, hidden_size=64, intermediate_size=96)
    path = hf_testing.save_hf_model(hf, tempfile.mkdtemp())
    model = models.from_pretrained(path, mesh=mesh_shape and sh.make_mesh(mesh_shape))
    prompts = _prompts(9, (6, 11, 2, 9))
    kw = dict(num_samples=2, max_new_tokens=12, temperature=1.0, eos_ids=(EOS,), seed=3)
    scan = sampling.generate(model, prompts, layer_loop="scan", **kw)
    unrolled = sampling.generate(model, prompts, layer_loop="unrolled", **kw)
    np.testing.assert_array_equal(np.asarray(scan.tokens), np.asarray(unrolled.tokens))
    np.testing.assert_allclose(np.asarray(scan.logprobs), np.asarray(unrolled.logprobs), atol=2e-5)
    # ...and both are the model's own log-probs of what they sampled.
    for i in range(len(prompts) * 2):
      n = int(scan.lengths[i])
      want, _ = _completion_logp(model, prompts[i // 2], np.asarray(scan.tokens[i, :n]))
      np.testing.assert_allclose(np.asarray(scan.logprobs[i, :n]), want, atol=2e-5)

  def test_scan_and_unrolled_sample_the_same(self):
    self._scan_and_unrolled_sample_the_same(None)

  @pytest.mark.mesh
  def test_scan_and_unrolled_sample_the_same_on_a_mesh(self):
    self._scan_and_unrolled_sample_the_same(dict(data=2, fsdp=2, tensor=2))

  def test_auto_unrolls_shallow_models_on_cpu(self):
    cfg = models.ModelConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_layers=2,
                             num_heads=2, num_kv_heads=1, head_dim=4)
    unrolls = lambda layers, loop="auto": sampling.unrolls_layers(
        sampling.SamplingSettings(1, 1, layer_loop=loop),
        models.Model(None, cfg.replace(num_layers=layers)))
    deepest = sampling.DECODE_TUNING["cpu"].unroll_max_layers
    self.assertTrue(unrolls(deepest))
    self.assertFalse(unrolls(deepest + 1))  # compile time stays flat
    self.assertTrue(unrolls(28, "unrolled"))
    self.assertFalse(unrolls(2, "scan"))
    # The one platform query decides: a TPU always scans, a GPU unrolls every published depth.
    with mock.patch.object(platform, "of", lambda mesh=None: "tpu"):
      self.assertFalse(unrolls(2))
    with mock.patch.object(platform, "of", lambda mesh=None: "gpu"):
      self.assertTrue(unrolls(64))
      self.assertFalse(unrolls(65))
    with self.assertRaisesRegex(ValueError, "layer_loop='both'"):
      sampling.SamplingSettings(1, 1, layer_loop="both")

  def test_generate_keeps_a_bounded_cache_that_frees(self):
    _, model = _model()
    sampling.free_generate_cache()
    # (StoppingTest's settings and bucket: its program, from the session's compilation cache.)
    sampling.generate(model, _prompts(7, (4, 4)), num_samples=4, max_new_tokens=6)
    self.assertEqual(sampling.sampler._sampler.cache_info().currsize, 1)  # generate keeps it
    for n in range(sampling.GENERATE_CACHE_SIZE + 1):  # more settings than it keeps (the
      # samplers `generate` would make for them, without compiling each)
      sampling.sampler._sampler(sampling.settings.SamplingSettings(1, max_new_tokens=3 + n))
    kept = sampling.sampler._sampler.cache_info().currsize
    self.assertEqual(kept, sampling.GENERATE_CACHE_SIZE)
    sampling.free_generate_cache()
    self.assertEqual(sampling.sampler._sampler.cache_info().currsize, 0)


class BFloat16Test(parameterized.TestCase):
  """The sampler in bf16, the compute dtype of real models (README), against the model's own
  bf16 forward: the behaviour log-probs a bf16 trainer compares its ratios with."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf = hf_testing.make_hf_model("qwen3")
    path = hf_testing.save_hf_model(hf, tempfile.mkdtemp())
    cls.bf16 = models.from_pretrained(path, dtype="bfloat16")
    cls.f32 = models.from_pretrained(path)

  def _gap(self, model, out, prompts, G):
    diffs = []
    for row in range(len(prompts) * G):
      n = int(out.lengths[row])
      want, _ = _completion_logp(model, prompts[row // G], np.asarray(out.tokens[row, :n]))
      diffs.append(np.abs(np.asarray(out.logprobs[row, :n]) - want))
    return np.concatenate(diffs)

  @parameterized.parameters("unrolled", "scan")
  def test_logprobs_match_the_bf16_forward(self, layer_loop):
    prompts = _prompts(12, (5, 9, 7, 12))
    out = sampling.generate(self.bf16, prompts, num_samples=4, max_new_tokens=16, seed=1,
                            layer_loop=layer_loop)
    self.assertEqual(out.logprobs.dtype, jnp.float32)
    gap = self._gap(self.bf16, out, prompts, 4)
    # bf16 keeps 8 mantissa bits; the decode attends over a KV cache in another order than the
    # full forward, so log-probs differ by a few bf16 ulps of the logits (|logit| < 4: an ulp
    # is <= 0.016). Measured: mean 1.8e-3, max 7.7e-3; the bounds leave 4x room.
    self.assertLess(gap.max(), 0.03)
    self.assertLess(gap.mean(), 0.008)
    # ...while the float32 model's log-probs of the same tokens are further away: the
    # comparison can tell the dtypes apart.
    self.assertGreater(self._gap(self.f32, out, prompts, 4).mean(), gap.mean())

  def test_greedy_follows_the_bf16_forward(self):
    prompts = _prompts(13, (6, 10))
    out = sampling.generate(self.bf16, prompts, num_samples=1, max_new_tokens=12,
                            temperature=0.0)
    checked = 0
    for row, prompt in enumerate(prompts):
      n = int(out.lengths[row])
      completion = np.asarray(out.tokens[row, :n])
      _, logp = _completion_logp(self.bf16, prompt, completion)
      top2 = np.sort(logp, axis=-1)[:, -2:]
      clear = top2[:, 1] - top2[:, 0] > 0.05  # steps whose top choice bf16 rounding cannot flip
      np.testing.assert_array_equal(completion[clear], logp.argmax(-1)[clear])
      checked += clear.sum()
    self.assertGreaterEqual(checked, 5)


def _all_gathers_in_loops(hlo: str) -> list[str]:
  """The all-gathers of floating-point arrays in the while-loop bodies of compiled HLO text
  (and in every computation those bodies call)."""
  computations = {m.group(1).lstrip("%"): m.group(2) for m in re.finditer(
      r"^(%?[\w.\-]+) .*?\{\n(.*?)^\}", hlo, re.S | re.M)}
  todo, seen = re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo), set()
  while todo:
    name = todo.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    todo += re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", computations[name])
  return [line.strip() for name in seen for line in computations[name].splitlines()
          if re.search(r"= (f32|bf16|f16)\[.*all-gather\(", line)]


@pytest.mark.mesh
class DecodeLayoutTest(parameterized.TestCase):
  """FSDP-trained weights are gathered once per call, not once per token (weight_layout)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    hf = hf_testing.make_hf_model("llama", vocab_size=128, hidden_size=64, intermediate_size=96)
    path = hf_testing.save_hf_model(hf, tempfile.mkdtemp())
    cls.plain = models.from_pretrained(path)
    cls.sharded = models.from_pretrained(path, mesh=sh.make_mesh(dict(data=1, fsdp=4, tensor=2)))

  @parameterized.parameters("scan", "unrolled")
  def test_no_weight_all_gather_inside_the_decode_loop(self, layer_loop):
    sampler = sampling.Sampler(sampling.SamplingSettings(2, 8, layer_loop=layer_loop))
    hlo = sampler.lower(self.sharded, _prompts(14, (4, 7, 5, 9))).compile().as_text()
    self.assertEqual(_all_gathers_in_loops(hlo), [])
    # The same samples as the unsharded model.
    kw = dict(num_samples=2, max_new_tokens=8, temperature=0.0, layer_loop=layer_loop)
    prompts = _prompts(15, (4, 7, 5, 9))
    np.testing.assert_array_equal(
        np.asarray(sampling.generate(self.sharded, prompts, **kw).tokens),
        np.asarray(sampling.generate(self.plain, prompts, **kw).tokens))

  def test_the_training_layout_gathers_inside_the_loop(self):
    """What the decode layout avoids (the check above can fail)."""
    settings = sampling.SamplingSettings(2, 8, layer_loop="scan", weight_layout="training")
    hlo = sampling.Sampler(settings).lower(self.sharded, _prompts(14, (4, 7, 5, 9))).compile()
    self.assertNotEqual(_all_gathers_in_loops(hlo.as_text()), [])


class BadInputTest(absltest.TestCase):

  def test_errors(self):
    _, model = _model("llama")
    with self.assertRaisesRegex(ValueError, "prompts is empty"):
      sampling.generate(model, [], 2, 4)
    with self.assertRaisesRegex(ValueError, "a prompt is empty"):
      sampling.generate(model, [[5], []], 2, 4)
    with self.assertRaisesRegex(ValueError, r"token ids must lie in \[0, 97\)"):
      sampling.generate(model, [[5, 300]], 2, 4)
    with self.assertRaisesRegex(ValueError, "top_p=0.0"):
      sampling.generate(model, [[5]], 2, 4, top_p=0.0)
    with self.assertRaisesRegex(ValueError, "temperature=-1.0"):
      sampling.generate(model, [[5]], 2, 4, temperature=-1)
    with self.assertRaisesRegex(ValueError, "max_new_tokens=0"):
      sampling.generate(model, [[5]], 2, 0)


if __name__ == "__main__":
  absltest.main()
