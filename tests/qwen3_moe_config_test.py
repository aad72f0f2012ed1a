"""configs/qwen3_moe_gsm8k.py: the v5p-64 variant validates on 32 devices as 8 hosts, its
mesh divides the Qwen3-30B-A3B shapes it shards, and `runlocal` trains end to end on a
tiny random Qwen3-MoE checkpoint. The 32 devices run in a subprocess (this process has 8)."""
import math
import os
import subprocess
import sys

import pytest
from absl.testing import absltest

from configs import qwen3_moe_gsm8k
from tests import qwen3_gsm8k_config_test as dense_test
from tests import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Qwen3MoeConfigTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = dense_test.tiny_qwen3(
        os.path.join(absltest.get_default_test_tmpdir(), "tiny_qwen3_moe"), arch="qwen3_moe")

  def test_validates_on_32_devices_as_8_hosts(self):
    script = ("import sys, jax; from unittest import mock; from configs import qwen3_moe_gsm8k; "
              "from jaxrl_llm import config as c, sharding as sh\n"
              "cfg = qwen3_moe_gsm8k.get_config('tpu_v5p_64'); cfg.model.path = sys.argv[1]\n"
              "cfg.data.source = 'jsonl:/data/gsm8k/{split}.jsonl'\n"
              "with mock.patch.object(jax, 'process_count', return_value=8): c.validate(cfg)\n"
              "print(*sh.make_mesh(cfg.mesh).shape.values())")
    run = subprocess.run([sys.executable, "-c", script, self.model], cwd=REPO, text=True,
                         capture_output=True, timeout=300,
                         env=dict(os.environ, JAX_PLATFORMS="cpu",
                                  XLA_FLAGS=xla_flags.for_devices(32)))
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    # data, fsdp, expert, context, tensor
    self.assertEqual(run.stdout.split(), ["1", "4", "8", "1", "1"])
    config = qwen3_moe_gsm8k.get_config()
    a, shards = config.model.arch, 1 * 4 * 8
    self.assertEqual(a.num_experts % 8, 0)  # 'expert' -> expert
    for dim in ("hidden_size", "moe_intermediate_size"):
      self.assertEqual(a[dim] % 4, 0, dim)  # 'embed' -> fsdp (the experts' mlp: tensor, 1)
    rows = config.train.prompts_per_step * config.sampling.num_samples
    self.assertEqual(rows % config.train.micro_batch_size, 0)
    self.assertEqual(config.train.micro_batch_size % shards, 0)
    self.assertEqual(config.train.prompts_per_step % 8, 0)  # 8 hosts load equal shares
    self.assertEqual(config.algo.routing_replay, "rollout")

  @pytest.mark.slow("trains the recipe's own runlocal variant end to end (two steps): the "
                    "MoE sampler that records the routing, prepare and the update that "
                    "replays it each compile for CPU")
  def test_runlocal_trains_on_a_tiny_qwen3_moe(self):
    rows = dense_test.train_runlocal(self, qwen3_moe_gsm8k.get_config("runlocal"), self.model)
    self.assertEqual([r["step"] for r in rows], [1, 2])
    for row in rows:
      self.assertEqual(row["moe/routing_mismatch"], 0.0)  # replayed
      self.assertTrue(math.isfinite(row["moe/aux_loss"]), row)


if __name__ == "__main__":
  absltest.main()
