"""Where the old log-probs come from in bf16 (`plan.resolve_old_logp`), and why it matters."""
import json
import os

from absl.testing import absltest, parameterized

from configs import gspo
from jaxrl_llm import training
from jaxrl_llm.training import plan


def _gspo_bf16(old_logp="auto"):
  """GSPO's first pass (one minibatch, one step: the ratio is 1 by definition) in bf16, on a
  random model large enough for the sampler's and the trainer's numerics to part."""
  c = gspo.get_config("runlocal")
  a = c.model.arch
  a.hidden_size, a.intermediate_size, a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim = (
      128, 256, 4, 4, 2, 32)
  c.model.dtype = "bfloat16"
  c.algo.num_minibatches, c.algo.old_logp = 1, old_logp
  c.train.steps, c.train.prompts_per_step = 1, 8
  c.sampling.max_new_tokens, c.sampling.temperature = 32, 0.7
  c.logging.trackers = ("jsonl",)
  return c


class OldLogpTest(parameterized.TestCase):

  def _first_pass(self, config):
    workdir = self.create_tempdir().full_path
    training.train(config, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      return [json.loads(line) for line in f][-1]

  def test_bf16_first_pass_ratio_is_one(self):
    config = _gspo_bf16()
    self.assertEqual(plan.resolve_old_logp(config), "recompute")
    row = self._first_pass(config)
    # The recomputed old log-probs are the update's own forward, bit for bit.
    self.assertEqual((row["ratio_min"], row["ratio_max"]), (1.0, 1.0))
    self.assertLessEqual(row["clip_frac"], 0.01)
    # The sampler's log-probs (a decode with a KV cache) differ in bf16: what auto avoids.
    sampled = self._first_pass(_gspo_bf16("sampler"))
    self.assertGreater(max(sampled["ratio_max"] - 1, 1 - sampled["ratio_min"]), 1e-4)

  def test_bf16_first_pass_ratio_is_one_with_lora_on_an_int8_base(self):
    config = _gspo_bf16()
    config.lora.rank, config.lora.base_quant, config.lora.alpha = 8, "int8", 16.0
    row = self._first_pass(config)
    self.assertEqual((row["ratio_min"], row["ratio_max"]), (1.0, 1.0))

  @parameterized.parameters(
      ("auto", "bfloat16", "sequence", "recompute"), ("auto", "float16", "token", "recompute"),
      ("auto", "float32", "sequence", "sampler"), ("auto", "bfloat16", "none", "sampler"),
      ("sampler", "bfloat16", "sequence", "sampler"), ("recompute", "float32", "token", "recompute"))
  def test_auto_resolves_by_dtype_and_ratio(self, old_logp, dtype, ratio, want):
    config = gspo.get_config()
    config.algo.old_logp, config.model.dtype, config.algo.loss.ratio = old_logp, dtype, ratio
    self.assertEqual(plan.resolve_old_logp(config), want)
    self.assertEqual(training.make_plan(config).old_logp, want)
    self.assertEqual(config.algo.old_logp, old_logp)  # the user's config is left as it was


if __name__ == "__main__":
  absltest.main()
