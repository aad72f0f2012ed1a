"""GRPO with LoRA end to end: the state, the reference, resume, the exports against PEFT."""
import os
import shutil

import jax
import numpy as np
import peft
import safetensors.numpy
import torch
import transformers
import pytest
from absl.testing import absltest

from configs import grpo_arithmetic_lora
from jaxrl_llm import assets, models, training
from jaxrl_llm.models import lora
from jaxrl_llm.training import setup as setup_lib
from tests import cli_runs
from tests.training import async_configs
from tests.training.run_logs import assert_rows_close, read_jsonl, resume_from_step_two


def _arithmetic_lora(steps: int, base_path: str | None = None):
  """configs/grpo_arithmetic_lora.py at local sizes (rank 16, every projection)."""
  config = grpo_arithmetic_lora.get_config("runlocal")
  config.train.steps = steps
  config.checkpoint.every = 2
  if base_path is not None:
    config.model.path = base_path
  return config


class LoraSetupTest(absltest.TestCase):

  def test_the_state_trains_adapters_and_the_reference_is_the_base(self):
    config = _arithmetic_lora(2)
    config.algo.kl.coef = 0.05  # a reference exists
    setup = training.set_up(config, training.make_plan(config))
    names = {jax.tree_util.keystr(p)[-10:] for p, _ in
             jax.tree_util.tree_flatten_with_path(setup.layout.policy_params)[0]}
    self.assertEqual(names, {"['lora_a']", "['lora_b']"})
    m = setup.models
    self.assertIsNotNone(m.reference)
    self.assertFalse(m.reference.config.has_lora)
    # No second copy: the reference's arrays are the base's own.
    for a, b in zip(jax.tree.leaves(m.reference.params), jax.tree.leaves(m.base)):
      self.assertIs(a, b)
    self.assertLen(setup.base_fingerprint, 16)


class LoraTrainingTest(absltest.TestCase):

  @pytest.mark.mesh
  @pytest.mark.slow("a 4-step LoRA run on a 2x2x2 mesh and its resume from step 2, then "
                    "PEFT and transformers load the exports")
  def test_resume_is_exact_and_the_exports_match_peft(self):
    config = _arithmetic_lora(4)
    config.lora.dropout = 0.1
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
    first = self.create_tempdir().full_path
    training.train(config, first)
    second = self.create_tempdir().full_path
    resumed = resume_from_step_two(config, first, second)
    rows = read_jsonl(first)
    self.assertEqual([r["step"] for r in resumed], [1, 2, 3, 4])
    assert_rows_close(rows[2:], resumed[2:], rtol=1e-6, atol=1e-7)
    adapters = [safetensors.numpy.load_file(os.path.join(d, "adapter", lora.PEFT_WEIGHTS_FILE))
                for d in (first, second)]
    self.assertEqual(adapters[0].keys(), adapters[1].keys())
    for name in adapters[0]:
      np.testing.assert_array_equal(adapters[0][name], adapters[1][name], err_msg=name)
    self.assertGreater(max(np.abs(x).max() for n, x in adapters[0].items() if "lora_B" in n), 0)

    # DIR/adapter/ onto the base with PEFT, DIR/export/ (merged) with transformers alone,
    # and this project's policy: the same logits.
    base_dir = assets.path("arithmetic_sft")
    ids = np.array([[1, 20, 30, 12, 25, 31, 40, 2], [1, 21, 33, 14, 25, 35, 41, 9]])
    mask = np.ones_like(ids)
    ours = np.asarray(models.compute_logits(models.from_pretrained(
        os.path.join(first, "export")), ids, mask))
    load = lambda path: transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32).eval()
    with torch.no_grad():
      merged = load(os.path.join(first, "export"))(torch.tensor(ids)).logits.numpy()
      peft_model = peft.PeftModel.from_pretrained(load(base_dir),
                                                  os.path.join(first, "adapter")).eval()
      adapted = peft_model(torch.tensor(ids)).logits.numpy()
      plain = load(base_dir)(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(merged, ours, atol=1e-4, rtol=0)
    np.testing.assert_allclose(adapted, ours, atol=1e-4, rtol=0)
    self.assertGreater(np.abs(plain - ours).max(), 1e-3)  # the adapters did change the model

  def test_a_resume_against_another_base_exits_2_with_one_line(self):
    root = self.create_tempdir().full_path
    base = os.path.join(root, "base")
    shutil.copytree(assets.path("arithmetic_sft"), base)
    workdir = os.path.join(root, "run")
    training.train(_arithmetic_lora(2, base), workdir)
    weights = os.path.join(base, "model.safetensors")
    tensors = safetensors.numpy.load_file(weights)
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name] + np.float32(1e-3)
    safetensors.numpy.save_file(tensors, weights, metadata={"format": "pt"})
    before = sorted(os.listdir(workdir))
    done = cli_runs.run(
        "launch.train", ["--config=configs/grpo_arithmetic_lora.py:runlocal",
                         f"--workdir={workdir}", f"--config.model.path={base}",
                         "--config.train.steps=4", "--config.checkpoint.every=2"],
        env=dict(os.environ, JAX_PLATFORMS="cpu"))
    self.assertEqual(done.returncode, 2, done.stderr[-2000:])
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    self.assertLen(lines, 1, lines)
    self.assertIn("base", lines[0])
    self.assertIn("fingerprint", lines[0])
    self.assertEqual(sorted(os.listdir(workdir)), before)

  @pytest.mark.mesh
  def test_asynchronous_rollouts_on_their_own_devices(self):
    config = async_configs.get_config("split")
    config.train.steps = 2
    config.lora.rank, config.lora.base_quant = 4, "int8"
    config.lora.targets = "qkv_proj,down_proj"
    workdir = self.create_tempdir().full_path
    training.train(config, workdir)
    rows = read_jsonl(workdir)
    self.assertEqual([r["step"] for r in rows], [1, 2])
    self.assertTrue(all(np.isfinite(r["loss"]) for r in rows))
    self.assertTrue(os.path.exists(os.path.join(workdir, "adapter", lora.PEFT_CONFIG_FILE)))


class LoraConfigTest(absltest.TestCase):

  def test_bad_values_name_the_field(self):
    from jaxrl_llm import config as config_lib
    cases = [({"rank": -1}, "config.lora.rank=-1"),
             ({"rank": 4, "targets": "q_proj"}, "config.lora.targets='q_proj'"),
             ({"rank": 4, "alpha": 0.0}, "config.lora.alpha=0.0"),
             ({"rank": 4, "dropout": 1.0}, "config.lora.dropout=1.0"),
             ({"rank": 4, "base_quant": "nf4"}, "config.lora.base_quant='nf4'"),
             ({"base_quant": "int8"}, "config.lora.base_quant='int8'")]
    for changes, message in cases:
      config = _arithmetic_lora(2)
      config.lora.rank = 0
      config.lora.update(changes)
      with self.assertRaisesRegex(config_lib.ConfigError, message.replace("(", r"\(")):
        config_lib.validate(config)


class PolicyConfigTest(absltest.TestCase):

  def test_config_lora_reaches_the_model_config(self):
    config = _arithmetic_lora(2)
    config.lora.targets = "qkv_proj, o_proj"
    cfg = setup_lib.policy_config(config)
    self.assertEqual((cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets),
                     (16, 32.0, ("qkv_proj", "o_proj")))


if __name__ == "__main__":
  absltest.main()
