"""configs/qwen3_8b_16k.py, qwen3_8b_32k.py, qwen3_moe_16k.py: each default variant loads
with its length and the long reasoning axes, validates on its slice's chips as its slice's
hosts (`chips.slice_chips`, as `--dry_run` checks a recipe: no TPU or libtpu needed), its
mesh of five axes (data, fsdp, expert, context, tensor) fills the slice, and its sharded
shapes divide; `qwen3_8b_16k:runlocal` trains two steps on a tiny random Qwen3. Whether
each fits is launch.compile's (minutes per recipe: README, "Compiled for TPU";
tests/aot/recipes_test.py lays each over its TPU slice's own chips)."""
import os
from unittest import mock

import jax
from absl.testing import absltest, parameterized

from jaxrl_llm import config as config_lib
from jaxrl_llm import sharding as sh
from jaxrl_llm.aot import chips
from tests import qwen3_gsm8k_config_test as dense_test

# recipe -> (new tokens, mesh (data, fsdp, expert, context, tensor))
RECIPES = {"qwen3_8b_16k": (16_384, (2, 16, 1, 1, 1)),
           "qwen3_8b_32k": (32_768, (2, 32, 1, 1, 1)),
           "qwen3_moe_16k": (16_384, (1, 4, 8, 1, 1))}


class Qwen3LongConfigTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tmp = absltest.get_default_test_tmpdir()
    cls.models = {arch: dense_test.tiny_qwen3(os.path.join(tmp, f"tiny_{arch}"), arch=arch)
                  for arch in ("qwen3", "qwen3_moe")}

  @parameterized.parameters(*RECIPES)
  def test_default_variant_is_its_length_and_validates_on_its_slice(self, recipe):
    new_tokens, mesh = RECIPES[recipe]
    config = config_lib.preset(recipe)
    self.assertTrue(recipe.endswith(f"_{new_tokens // 1024}k"))
    self.assertEqual(config.sampling.max_new_tokens, new_tokens)
    self.assertEqual(config.algo.overlong.max_len, new_tokens)  # follows the length
    self.assertEqual(config.algo.overlong.cache_len, new_tokens // 5)
    self.assertLessEqual(max(config.sampling.prompt_buckets) + new_tokens,
                         config.model.arch.max_position_embeddings)
    self.assertBetween(config.sampling.num_samples, 8, 16)
    self.assertBetween(config.train.prompts_per_step, 32, 128)
    self.assertTrue(config.mesh.topology.startswith("v5p:"), config.mesh.topology)
    devices = chips.slice_chips(config.mesh.topology)
    hosts = len(devices) // 4  # a v5p host has 4 chips
    self.assertEqual(len(devices), _product(mesh))
    arch = "qwen3_moe" if config.model.arch.model_type == "qwen3_moe" else "qwen3"
    config.model.path = self.models[arch]
    config.data.source = "jsonl:/data/math/{split}.jsonl"  # not opened
    with mock.patch.object(jax, "process_count", return_value=hosts):
      config_lib.validate(config, devices)
    self.assertEqual(tuple(sh.make_mesh(config.mesh, devices).shape.values()), mesh)
    self._check_shards(config, mesh, hosts)

  def _check_shards(self, config, mesh, hosts):
    data, fsdp, expert, context, tensor = mesh
    a, t = config.model.arch, config.train
    shards = data * fsdp * expert  # the batch's mesh axes
    embed = fsdp * (expert if a.model_type == "qwen3_moe" else 1)
    self.assertEqual(a.hidden_size % embed, 0)
    if a.model_type == "qwen3_moe":
      self.assertEqual(a.num_experts % expert, 0)
    rows = t.prompts_per_step * config.sampling.num_samples
    self.assertEqual(rows % t.micro_batch_size, 0)
    self.assertEqual(t.micro_batch_size % shards, 0)
    self.assertEqual(t.prompts_per_step % hosts, 0)  # every host loads an equal share

  @parameterized.parameters(*RECIPES)
  def test_runlocal_validates_on_one_device(self, recipe):
    config = config_lib.preset(f"{recipe}:runlocal")
    arch = "qwen3_moe" if recipe.startswith("qwen3_moe") else "qwen3"
    config.model.path = self.models[arch]
    config.data.source = "jsonl:/data/math/{split}.jsonl"
    config_lib.validate(config)
    self.assertEqual(config.rewards.functions, ("jaxrl_llm.rewards.math:math_verify",))
    self.assertEqual(config.algo.loss.aggregation, "token_mean")


  def test_runlocal_trains_on_a_tiny_qwen3(self):
    """The long-reasoning axes end to end: math-verify scores the completions, the overlong
    penalty shapes them (all 16 tokens long, past 16 - 3), the token-level loss is finite."""
    rows = dense_test.train_runlocal(self, config_lib.preset("qwen3_8b_16k:runlocal"),
                                     self.models["qwen3"])
    self.assertEqual([r["step"] for r in rows], [1, 2])
    for row in rows:
      self.assertIn("reward/math_verify", row)
      self.assertLess(row["reward_shaped_mean"], row["reward_mean"] + 1e-6)


def _product(values) -> int:
  out = 1
  for v in values:
    out *= v
  return out


if __name__ == "__main__":
  absltest.main()
