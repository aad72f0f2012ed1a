"""On-policy distillation end to end: a teacher of another size is loaded, scores the
policy's samples, and the policy's reverse KL to it falls; bad teachers stop before
anything loads."""
import json
import os
import shutil

from absl.testing import absltest
import pytest
import jax
import numpy as np

from configs import arithmetic
from jaxrl_llm import assets
from jaxrl_llm import config as config_lib
from jaxrl_llm import data, models, training
from jaxrl_llm.config import ConfigError
from jaxrl_llm.models import load
from jaxrl_llm.models.config import from_hf_dict
from jaxrl_llm.training import setup as setup_lib


def opd_config(teacher_path, steps=2):
  config = config_lib.preset("opd:runlocal")
  config.teacher.path = teacher_path
  config.train.steps = steps
  config.optimizer.lr = 3e-3
  config.optimizer.warmup_steps = 0
  return config


def save_teacher(path, config, **arch):
  """A random model of another shape (`arch`) with the policy's tokenizer, as an HF dir."""
  cfg = setup_lib.model_config(config.model).replace(**arch)
  models.save_pretrained(models.init(cfg, jax.random.PRNGKey(7)), path)
  data.run_tokenizer(config.model).save_pretrained(path)
  return path


def read_jsonl(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def save_deeper_teacher(path, extra_rows=32):
  """The shipped GRPO-trained model made larger than the student: a fifth layer that adds
  nothing (zero output projections; the residual passes through) and `extra_rows` more
  embedding rows (copies of an unused filler token's, so they stay improbable)."""
  source = assets.path("arithmetic_grpo")
  cfg = from_hf_dict(load.read_config(source))
  params = load.load_params(source, cfg)

  def add_layer(path_, x):
    new = x[:1]
    if any(getattr(k, "key", None) in ("o_proj", "down_proj") for k in path_):
      new = np.zeros_like(new)
    return np.concatenate([x, new])

  layers = jax.tree_util.tree_map_with_path(add_layer, jax.device_get(params["layers"]))
  embed = np.asarray(params["embed"])
  embed = np.concatenate([embed, np.repeat(embed[-1:], extra_rows, axis=0)])
  deeper = cfg.replace(num_layers=cfg.num_layers + 1, vocab_size=cfg.vocab_size + extra_rows)
  models.save_pretrained(models.Model(dict(params, layers=layers, embed=embed), deeper), path)
  shutil.copy(os.path.join(source, "tokenizer.json"), path)
  shutil.copy(os.path.join(source, "tokenizer_config.json"), path)
  return path


class DistillationRunTest(absltest.TestCase):

  @pytest.mark.optimized  # 20 steps of 512 sampled rows: XLA's optimisations pay
  @pytest.mark.slow("learning is the property: 20 steps of the preset's 512 rows, the fewest "
                    "in which the reverse KL falls and the accuracy rises beyond noise")
  def test_student_learns_from_a_larger_teacher_on_the_demo_task(self):
    # Student: the demo's warm start (4 layers, 128 embedding rows); teacher: the GRPO-trained
    # model with 5 layers and 160 rows. 20 steps of the preset's 512 sampled rows.
    config = arithmetic.get_config("preset=opd,steps=20")
    config.teacher.path = save_deeper_teacher(self.create_tempdir().full_path)
    config.train.log_every = 1
    config.checkpoint.every = 0
    workdir = self.create_tempdir().full_path
    training.train(config, workdir)
    rows = read_jsonl(workdir)
    kl = [r["distill/reverse_kl"] for r in rows if "distill/reverse_kl" in r]
    self.assertLen(kl, 20)
    self.assertLess(np.mean(kl[-5:]), 0.6 * np.mean(kl[:5]), kl)  # the reverse KL falls
    accuracy = [r["eval/reward/arithmetic_exact"] for r in rows
                if "eval/reward/arithmetic_exact" in r]
    self.assertGreater(accuracy[-1], accuracy[0] + 0.1, accuracy)  # and the student improves
    for r in rows[1:]:
      self.assertEqual(r["pg_loss"], 0.0)  # no advantage enters the loss

  def test_teacher_of_another_shape_and_a_padded_embedding(self):
    # Student: the preset's random 2-layer, 64-wide model; teacher: 3 layers, 96 wide, 640
    # embedding rows for the same 512-token tokenizer. The teacher's log-probs reach the loss.
    config = opd_config("")
    config.teacher.path = save_teacher(self.create_tempdir().full_path, config, num_layers=3,
                                       hidden_size=96, intermediate_size=192, vocab_size=640)
    last = training.train(config, self.create_tempdir().full_path)
    self.assertEqual(last["pg_loss"], 0.0)
    self.assertGreater(last["distill/reverse_kl"], 0.0)
    # One on-policy pass: ρ = 1, so the loss is the token mean of log π - log π_T, the
    # reverse-KL estimate of the same batch.
    self.assertAlmostEqual(last["distill_loss"], last["distill/reverse_kl"], places=4)

  def test_shaping_inside_grpo(self):
    config = config_lib.preset("grpo:runlocal")
    config.algo.distill.shaping_coef = 1.0
    config.teacher.path = save_teacher(self.create_tempdir().full_path, config, num_layers=1)
    last = training.train(config, self.create_tempdir().full_path)
    self.assertTrue(np.isfinite(last["distill/reverse_kl"]))
    self.assertTrue(np.isfinite(last["pg_loss"]))
    self.assertNotIn("distill_loss_frac", last)


class BadTeacherTest(absltest.TestCase):

  def test_other_tokenizer_is_refused_in_one_line(self):
    config = opd_config("")
    teacher = save_teacher(self.create_tempdir().full_path, config)
    file = os.path.join(teacher, "tokenizer.json")
    with open(file) as f:
      spec = json.load(f)
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # same tokens, two ids swapped
    with open(file, "w") as f:
      json.dump(spec, f)
    config.teacher.path = teacher
    workdir = self.create_tempdir().full_path
    with self.assertRaisesRegex(ConfigError, "maps 2 of the policy's 512 tokens to other ids") as e:
      training.train(config, workdir)
    self.assertNotIn("\n", str(e.exception))
    self.assertEqual(os.listdir(workdir), [])  # nothing written

  def test_teacher_without_a_reader_and_reader_without_a_teacher(self):
    config = config_lib.preset("grpo:runlocal")
    config.teacher.path = "/some/dir"
    with self.assertRaisesRegex(ConfigError, "config.teacher.path='/some/dir' is set but nothing "
                                "reads it"):
      config_lib.validate(config)
    with self.assertRaisesRegex(ConfigError, "config.teacher.path is required"):
      config_lib.validate(config_lib.preset("opd:runlocal"))
    config = config_lib.preset("grpo:runlocal")
    config.algo.distill.shaping_coef = 0.5
    with self.assertRaisesRegex(ConfigError, "algo.distill.shaping_coef = 0.5 distil from a "
                                "teacher, but config.teacher.path is ''"):
      config_lib.validate(config)

  def test_missing_teacher_dir(self):
    with self.assertRaisesRegex(ConfigError, "config.teacher.path='/no/such/teacher'"):
      config_lib.validate(opd_config("/no/such/teacher"))


if __name__ == "__main__":
  absltest.main()
