"""configs/qwen3_gsm8k.py: each hardware variant validates on that hardware's device count,
its mesh divides the Qwen3 shapes it shards, and `runlocal` trains end to end on a tiny
random Qwen3 checkpoint with a chat template and GSM8K records.

Device counts: gpu_1 = 1 GPU; tpu_v5e_8 = 8 chips (and a v5litepod-16: 16 chips on 4
hosts); tpu_v5p_32 = 32 TensorCores = 16 chips on 4 hosts, and JAX sees one device per
v5p chip. The 16-device cases run in a subprocess with 16 CPU devices (this process has 8).
"""
import json
import math
import os
import subprocess
import sys
from unittest import mock

import jax
import pytest
from absl.testing import absltest, parameterized

from configs import qwen3_gsm8k
from jaxrl_llm import sharding as sh
from jaxrl_llm import training
from jaxrl_llm.data import char_tokenizer
from jaxrl_llm import config as config_lib
from tests import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# variant -> (devices, processes, mesh it resolves to)
HARDWARE = {
    "gpu_1": (1, 1, {"0.6b": (1, 1, 1), "1.7b": (1, 1, 1)}),
    "tpu_v5e_8": (8, 1, {"0.6b": (1, 8, 1), "1.7b": (1, 4, 2)}),
}
PODS = {  # run with 16 devices in a subprocess
    "tpu_v5p_32": (16, 4, {"0.6b": (4, 4, 1), "1.7b": (4, 4, 1)}),
    "tpu_v5e_8": (16, 4, {"0.6b": (2, 8, 1), "1.7b": (2, 4, 2)}),  # on a v5litepod-16
}


def tiny_qwen3(path: str, arch: str = "qwen3") -> str:
  """A random 3-layer Qwen3 (or Qwen3-MoE) and a character tokenizer with a chat template,
  in `path`."""
  # Here, not at the top: the 16-device subprocess imports this module for `validate`, and
  # hf_testing brings torch (most of that process's start).
  from tests import hf_testing  # pylint: disable=g-import-not-at-top
  hf_testing.save_hf_model(hf_testing.make_hf_model(arch, vocab_size=128), path)
  char_tokenizer.build_char_tokenizer(path, vocab_size=128,
                                      chat_template=char_tokenizer.SIMPLE_CHAT_TEMPLATE)
  return path


def write_gsm8k_records(data_dir: str) -> str:
  """A few GSM8K-style records as `data_dir/{train,eval}.jsonl` (launch/prepare_gsm8k's
  layout); returns `data_dir`."""
  problems = [("Ann has 3 apples and buys 4 more. How many apples does she have?", 7),
              ("A box holds 12 pens. How many pens are in 2 boxes?", 24),
              ("Tom had 10 cards and gave away 4. How many are left?", 6)]
  for split in ("train", "eval"):
    with open(os.path.join(data_dir, f"{split}.jsonl"), "w") as f:
      for question, answer in problems:
        f.write(json.dumps({"prompt": f"{question}\n\nAnswer after ####.",
                            "answer": f"Work.\n#### {answer}"}) + "\n")
  return data_dir


def train_runlocal(test: absltest.TestCase, config, model_path: str) -> list[dict]:
  """Trains a recipe's `runlocal` variant on `model_path` and a few GSM8K records written by
  `write_gsm8k_records`; every logged metrics row, each asserted to have a finite loss."""
  data_dir = write_gsm8k_records(test.create_tempdir().full_path)
  config.model.path = model_path
  config.data.source = f"jsonl:{data_dir}/{{split}}.jsonl"
  workdir = test.create_tempdir().full_path
  training.train(config, workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  for row in rows:
    test.assertTrue(math.isfinite(row["loss"]), row)
  return rows


def validate(arg: str, model_path: str, num_devices: int, num_processes: int):
  """config.validate on the first `num_devices` devices as `num_processes` hosts; the mesh."""
  config = qwen3_gsm8k.get_config(arg)
  config.model.path = model_path
  config.data.source = "jsonl:/data/gsm8k/{split}.jsonl"  # not opened: data=False
  devices = jax.devices()[:num_devices]
  assert len(devices) == num_devices, f"{len(devices)} devices here, expected {num_devices}"
  with mock.patch.object(jax, "process_count", return_value=num_processes):
    config_lib.validate(config, devices)
  mesh = sh.make_mesh(config.mesh, devices)
  assert mesh.shape["expert"] == 1, mesh.shape  # a dense model: no expert parallelism
  return config, tuple(mesh.shape[a] for a in ("data", "fsdp", "tensor"))


def check_shards(test, config, size, mesh_shape):
  """The Qwen3 dimensions the rules shard split evenly; micro-batches split over the batch."""
  data, fsdp, tensor = mesh_shape
  shape = qwen3_gsm8k.QWEN3[size]
  test.assertEqual(shape["hidden_size"] % fsdp, 0)  # 'embed' -> fsdp
  for dim in ("num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
    test.assertEqual(shape[dim] % tensor, 0, dim)  # heads, kv_heads, mlp, vocab -> tensor
  rows = config.train.prompts_per_step * config.sampling.num_samples
  micro = config.train.micro_batch_size
  test.assertEqual(rows % micro, 0)
  test.assertEqual(micro % (data * fsdp), 0)  # every micro-batch splits over the batch shards


class Qwen3Gsm8kConfigTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = tiny_qwen3(os.path.join(absltest.get_default_test_tmpdir(), "tiny_qwen3"))

  @parameterized.product(hardware=sorted(HARDWARE), size=qwen3_gsm8k.SIZES)
  @pytest.mark.mesh
  def test_validates_on_its_devices(self, hardware, size):
    num_devices, num_processes, meshes = HARDWARE[hardware]
    config, mesh_shape = validate(f"{hardware},size={size}", self.model, num_devices,
                                  num_processes)
    self.assertEqual(mesh_shape, meshes[size])
    check_shards(self, config, size, mesh_shape)
    self.assertEqual((config.model.dtype, config.model.param_dtype, config.model.remat),
                     ("bfloat16", "float32", "full"))
    self.assertTrue(config.data.chat_template)
    self.assertEqual(config.model.path, self.model)
    # The model and the data are the user's to name: the recipe refuses to start without.
    unset = qwen3_gsm8k.get_config(f"{hardware},size={size}")
    unset.data.source = "jsonl:/data/gsm8k/{split}.jsonl"
    with self.assertRaisesWithLiteralMatch(
        config_lib.ConfigError, "config.model.path is required by this preset: set it, e.g. "
        "--config.model.path=..."):
      config_lib.validate(unset, jax.devices()[:num_devices])

  def test_pod_variants_validate_on_16_devices(self):
    script = ("import sys; from tests import qwen3_gsm8k_config_test as t; "
              "[print(hw, size, *t.validate(f'{hw},size={size}', sys.argv[1], n, p)[1]) "
              "for hw, (n, p, _) in t.PODS.items() for size in t.qwen3_gsm8k.SIZES]")
    run = subprocess.run([sys.executable, "-c", script, self.model], cwd=REPO, text=True,
                         capture_output=True, timeout=300,
                         env=dict(os.environ, JAX_PLATFORMS="cpu",
                                  XLA_FLAGS=xla_flags.for_devices(16)))
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    got = {tuple(line.split()[:2]): tuple(map(int, line.split()[2:]))
           for line in run.stdout.splitlines()}
    for hardware, (_, _, meshes) in PODS.items():
      for size in qwen3_gsm8k.SIZES:
        self.assertEqual(got[hardware, size], meshes[size])
        config = qwen3_gsm8k.get_config(f"{hardware},size={size}")
        check_shards(self, config, size, meshes[size])
        self.assertEqual(config.train.prompts_per_step % 4, 0)  # 4 hosts load equal shares

  def test_same_algorithm_on_every_hardware(self):
    configs = [qwen3_gsm8k.get_config(h) for h in ("gpu_1", "tpu_v5e_8", "tpu_v5p_32")]
    for config in configs:
      self.assertEqual(config.algo.to_dict(), configs[0].algo.to_dict())
      self.assertEqual(config.sampling.to_dict(), configs[0].sampling.to_dict())
      self.assertEqual(config.train.steps * config.train.prompts_per_step,
                       qwen3_gsm8k.TRAIN_PROMPTS)
    self.assertEqual(qwen3_gsm8k.get_config().to_json(), configs[0].to_json())  # gpu_1: default

  @parameterized.named_parameters(
      ("unknown_size", "size=4b", "size='4b': expected one of 0.6b, 1.7b"),
      ("two_machines", "gpu_1,tpu_v5p_32",
       "gpu_1 and tpu_v5p_32: expected at most one of gpu_1, tpu_v5e_8, tpu_v5p_32"),
  )
  def test_bad_argument(self, arg, message):
    with self.assertRaisesWithLiteralMatch(ValueError, message):
      qwen3_gsm8k.get_config(arg)

  def test_runlocal_trains_on_a_tiny_qwen3(self):
    """Chat template, bf16, remat, GSM8K records and reward: two steps, end to end."""
    rows = train_runlocal(self, qwen3_gsm8k.get_config("runlocal"), self.model)
    self.assertEqual([r["step"] for r in rows], [1, 2])
    for row in rows:
      self.assertIn("reward/gsm8k_exact", " ".join(row))


if __name__ == "__main__":
  absltest.main()
