"""Model-FLOP accounting against hand counts, and the peak it is measured against."""
import jax
import pytest
from absl.testing import absltest, parameterized

from configs import gspo, grpo, ppo, sft
from jaxrl_llm.models import flops as model_flops
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.training import flops

# V 10, D 4, F 6, L 2, H 2, K 1, Dh 2. By hand, per token:
#   weight matmuls: 2 * L * (D*Dh*(2H + 2K) + 3*D*F) = 2 * 2 * (48 + 72) = 480
#   attention over c keys: 4 * L * H * Dh * c = 32 c
#   unembedding: 2 * D * V = 80
MODEL = ModelConfig(vocab_size=10, hidden_size=4, intermediate_size=6, num_layers=2, num_heads=2,
                    num_kv_heads=1, head_dim=2)
# Rows of S0 = 3 prompt and N = 5 completion tokens (T = 8, mean causal context 4.5), 8 rows:
#   a forward over the batch: 8*8 tokens * (480 + 32*4.5) + 8*5 completion positions * 80
#                             = 64 * 624 + 40 * 80 = 43136
#   a critic's forward (no unembedding): 64 * 624 = 39936
BATCH_FORWARD, CRITIC_FORWARD = 43136, 39936
# Sampling 24 tokens over 8 rows (3 each, so the mean decode context is 3 + (3 + 1)/2 = 5):
#   decode: 24 * (480 + 32*5 + 80) = 17280
#   prefill of P prompts of 3 tokens (context 2), only the last one unembedded:
#     P = 2: 6 * (480 + 64) + 2 * 80 = 3424;  P = 8: 24 * 544 + 8 * 80 = 13696
DECODE, PREFILL_2, PREFILL_8 = 17280, 3424, 13696


def _count(algo, **kw):
  args = dict(prompt_len=3, new_tokens=5, generated=24, reference=False, value=False,
              recompute_old_logp=False)
  args.update(kw)
  return flops.step_flops(MODEL, algo, **args)


class StepFlopsTest(parameterized.TestCase):

  def test_moe_layers_count_their_active_parameters(self):
    # MODEL with layer 1 an MoE of E = 5 experts of width 3, k = 2 per token. By hand:
    #   layer 0 (dense): D*Dh*(2H + 2K) + 3*D*F = 48 + 72 = 120 weights per token
    #   layer 1 (MoE): 48 + router D*E = 20 + k experts 2 * 3*D*3 = 72: 140 (not 48 + 20 + 180)
    moe = MODEL.replace(model_type="qwen3_moe", qk_norm=True, num_experts=5,
                        num_experts_per_tok=2, moe_intermediate_size=3, moe_layers=(1,))
    self.assertEqual(model_flops.active_layer_params(moe), 120 + 140)
    self.assertEqual(model_flops.forward_flops(moe, 1, 0) - model_flops.forward_flops(MODEL, 1, 0),
                     2 * (140 - 120))

  def test_grpo_with_a_reference(self):
    got = _count(grpo.get_config().algo, prompts=2, samples=4, reference=True)
    self.assertAlmostEqual(got["sample"], PREFILL_2 + DECODE)
    self.assertAlmostEqual(got["logprob"], BATCH_FORWARD)  # the reference's forward
    self.assertAlmostEqual(got["update"], 3 * BATCH_FORWARD)  # forward + backward, once
    self.assertAlmostEqual(got["total"], PREFILL_2 + DECODE + 4 * BATCH_FORWARD)

  def test_gspo_four_minibatches_cover_the_batch_once(self):
    algo = gspo.get_config().algo
    self.assertEqual(algo.num_minibatches, 4)
    got = _count(algo, prompts=2, samples=4)
    self.assertAlmostEqual(got["logprob"], 0)  # no reference, sampler log-probs
    self.assertAlmostEqual(got["update"], 3 * BATCH_FORWARD)  # not 4 x 3

  def test_ppo_critic_and_four_epochs(self):
    algo = ppo.get_config().algo
    self.assertEqual(algo.num_iterations, 4)
    got = _count(algo, prompts=8, samples=1, reference=True, value=True)
    self.assertAlmostEqual(got["sample"], PREFILL_8 + DECODE)
    # Reference and critic forwards once; policy and critic forward + backward per epoch.
    self.assertAlmostEqual(got["logprob"], BATCH_FORWARD + CRITIC_FORWARD)
    self.assertAlmostEqual(got["update"], 3 * 4 * (BATCH_FORWARD + CRITIC_FORWARD))

  def test_sft_trains_only(self):
    got = _count(sft.get_config().algo, prompts=8, samples=1, generated=None)
    self.assertEqual(got["sample"], 0)
    self.assertEqual(got["logprob"], 0)
    self.assertAlmostEqual(got["update"], 3 * BATCH_FORWARD)

  def test_recomputed_old_logprobs_cost_a_forward(self):
    got = _count(grpo.get_config().algo, prompts=2, samples=4, recompute_old_logp=True)
    self.assertAlmostEqual(got["logprob"], BATCH_FORWARD)


class PeakTest(parameterized.TestCase):

  @parameterized.parameters(
      ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5p", 459e12), ("TPU v6 lite", 918e12),
      ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA H100 80GB HBM3", 989e12),
      ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H200", 989e12))
  def test_table(self, kind, peak):
    self.assertEqual(flops.table_peak(kind), peak)

  @pytest.mark.mesh
  def test_override_then_measured_fallback(self):
    devices = jax.devices()[:2]
    self.assertEqual(flops.peak_flops_per_device(devices, 5e12),
                     (5e12, "config.train.peak_flops_per_device"))
    self.assertIsNone(flops.table_peak(devices[0].device_kind))
    peak, source = flops.peak_flops_per_device(devices)
    self.assertGreater(peak, 1e9)  # any CPU does a GFLOP/s
    self.assertIn("measured on 2", source)


if __name__ == "__main__":
  absltest.main()
