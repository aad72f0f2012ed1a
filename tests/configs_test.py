"""Every file in configs/ loads, locks, validates, and drives policy_loss under jit."""
import functools
import glob
import importlib
import os

from absl import flags
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from jaxrl_llm import config as config_lib
from jaxrl_llm import objectives

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
CONFIG_NAMES = sorted(
    os.path.basename(p)[:-3] for p in glob.glob(os.path.join(CONFIG_DIR, "*.py"))
    if os.path.basename(p) not in ("common.py", "__init__.py"))
SUBTREES = ("model", "sampling", "algo", "optimizer", "mesh", "data", "rewards", "train",
            "checkpoint", "logging")

# The preset table of docs/objectives.md, one row per preset: the axes each preset must set.
PRESET_TABLE = {
    "ppo": dict(estimator="gae", aggregation="token_mean", ratio="token", trust_region="clip",
                clip=(0.2, 0.2), kl=("k1", "reward"), value_clip=0.2),
    "grpo": dict(estimator="grpo", aggregation="seq_mean_token_mean", ratio="token",
                 trust_region="clip", clip=(0.2, 0.2), kl=("k3", "loss"), kl_coef=0.04),
    "dr_grpo": dict(estimator="dr_grpo", aggregation="seq_mean_token_sum_norm", ratio="token",
                    trust_region="clip", clip=(0.2, 0.2), kl_coef=0.0),
    "dapo": dict(estimator="grpo", aggregation="token_mean", ratio="token", trust_region="clip",
                 clip=(0.2, 0.28), kl_coef=0.0, dynamic_sampling=True, overlong=True),
    "gspo": dict(estimator="grpo", aggregation="seq_mean_token_mean", ratio="sequence",
                 trust_region="clip", clip=(3e-4, 4e-4), kl_coef=0.0),
    "rloo": dict(estimator="rloo", aggregation="seq_mean_token_sum", ratio="none",
                 trust_region="none", kl=("k1", "reward")),
    "reinforce_pp": dict(estimator="reinforce_pp", aggregation="token_mean", ratio="token",
                         trust_region="clip", clip=(0.2, 0.2), kl=("k1", "reward")),
    "cispo": dict(estimator="grpo", aggregation="token_mean", ratio="token",
                  trust_region="cispo", kl_coef=0.0),
    "gmpo": dict(estimator="grpo", aggregation="seq_mean_token_mean", ratio="token",
                 trust_region="gmpo", clip=(0.4, 0.4), kl_coef=0.0),
    "sapo": dict(estimator="grpo", aggregation="seq_mean_token_mean", ratio="token",
                 trust_region="sapo", tau=(1.0, 1.05), kl_coef=0.0),
    "max_rl": dict(estimator="max_rl", aggregation="seq_mean_token_mean", ratio="token",
                   trust_region="clip", clip=(0.2, 0.2), kl=("k3", "loss"), kl_coef=0.04),
    "ipo": dict(estimator="grpo", aggregation="token_mean", ratio="token", trust_region="ipo",
                prob=(0.1, 0.1), kl_coef=0.0),
    "dppo_tv": dict(estimator="grpo", aggregation="token_mean", ratio="token",
                    trust_region="dppo_tv", prob=(0.2, 0.2), kl_coef=0.0),
    "opd": dict(estimator="grpo", aggregation="token_mean", ratio="token", trust_region="clip",
                kl_coef=0.0, pg_coef=0.0, distill_coef=1.0),
    "opsd": dict(estimator="grpo", aggregation="token_mean", ratio="token", trust_region="clip",
                 kl_coef=0.0, pg_coef=0.0, distill_coef=1.0),
    # The run-level axes of the mixed preset; its sources carry GRPO's and opd's per-row ones.
    "mixed": dict(estimator="grpo", aggregation="seq_mean_token_mean", ratio="token",
                  trust_region="clip", clip=(0.2, 0.2), kl_coef=0.0),
    "sft": dict(estimator="constant", aggregation="token_mean", ratio="none",
                trust_region="none", kl_coef=0.0),
}


def load_with_flags(argv):
  """Loads a config the way launch scripts do: a config_file flag with lock_config."""
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=flag_values, lock_config=True,
                                  sys_argv=argv)
  flag_values(argv)
  return flag_values.config


def get_config(name, arg=None):
  return importlib.import_module(f"configs.{name}").get_config(arg)


class ConfigFilesTest(parameterized.TestCase):

  def test_every_preset_has_a_file(self):
    self.assertContainsSubset(set(PRESET_TABLE) | {"smoke"}, set(CONFIG_NAMES))

  @parameterized.parameters(*CONFIG_NAMES)
  def test_loads_and_validates(self, name):
    path = os.path.join(CONFIG_DIR, f"{name}.py")
    config = load_with_flags(["prog", f"--config={path}", "--config.algo.kl.coef=0.5"])
    self.assertEqual(config.algo.kl.coef, 0.5)
    for subtree in SUBTREES:
      self.assertIn(subtree, config)
    config_lib.validate_algo(config.algo, config.sampling.num_samples)
    module = importlib.import_module(f"configs.{name}")
    self.assertIn("arXiv" if name in PRESET_TABLE and name != "sft" else "Run:", module.__doc__)
    if name != "smoke":
      local = get_config(name, "runlocal")
      config_lib.validate_algo(local.algo, local.sampling.num_samples)
      self.assertLessEqual(local.train.steps, 2)

  @parameterized.parameters(*CONFIG_NAMES)
  def test_unknown_keys_fail(self, name):
    path = os.path.join(CONFIG_DIR, f"{name}.py")
    with self.assertRaises(AttributeError):
      load_with_flags(["prog", f"--config={path}", "--config.algo.kl.coeff=0.5"])
    with self.assertRaises(flags.IllegalFlagValueError):
      load_with_flags(["prog", f"--config={path}:no_such_arg"])
    config = get_config(name)
    with self.assertRaises(AttributeError):
      config.algo.loss.clip_hgih = 0.3  # a typo must not silently add a key

  @parameterized.parameters(*PRESET_TABLE)
  def test_preset_matches_algorithms_table(self, name):
    algo = get_config(name).algo
    row = PRESET_TABLE[name]
    self.assertEqual(algo.advantage.estimator, row["estimator"])
    self.assertEqual(algo.loss.aggregation, row["aggregation"])
    self.assertEqual(algo.loss.ratio, row["ratio"])
    self.assertEqual(algo.loss.trust_region, row["trust_region"])
    if "clip" in row:
      self.assertEqual((algo.loss.clip_low, algo.loss.clip_high), row["clip"])
    if "kl" in row:
      self.assertEqual((algo.kl.estimator, algo.kl.placement), row["kl"])
      self.assertGreater(algo.kl.coef, 0.0)
    if "kl_coef" in row:
      self.assertEqual(algo.kl.coef, row["kl_coef"])
    if "prob" in row:
      self.assertEqual((algo.loss.prob_low, algo.loss.prob_high), row["prob"])
      self.assertEqual(algo.loss.log_ratio_coef, 1e-3)
    self.assertEqual(algo.loss.pg_coef, row.get("pg_coef", 1.0))
    self.assertEqual(algo.distill.coef, row.get("distill_coef", 0.0))
    if "tau" in row:
      self.assertEqual((algo.loss.tau_pos, algo.loss.tau_neg), row["tau"])
    if "value_clip" in row:
      self.assertEqual(algo.value.value_clip, row["value_clip"])
      self.assertGreater(algo.value.coef, 0.0)
    self.assertEqual(algo.dynamic_sampling.enabled, row.get("dynamic_sampling", False))
    self.assertEqual(algo.overlong.enabled, row.get("overlong", False))

  def test_arithmetic_puts_every_rl_preset_on_the_demo_task(self):
    from configs import arithmetic, grpo_arithmetic  # pylint: disable=g-import-not-at-top
    # sft is supervised; opsd needs a demonstration in each record, which the task lacks.
    self.assertEqual(set(arithmetic.PRESETS), set(PRESET_TABLE) - {"sft", "opsd"})
    for name in arithmetic.PRESETS:
      for arg in (f"preset={name}", f"preset={name},runlocal"):
        config = arithmetic.get_config(arg)
        config_lib.validate(config)  # 8 CPU devices: rows split over the batch shards
        preset = get_config(name)
        preset.sampling.max_new_tokens = 4  # the length-tied axes follow it (overlong, dr_grpo)
        self.assertEqual(config.algo.to_dict(), preset.algo.to_dict())  # the axes are the preset's
        self.assertEqual(config.sampling.max_new_tokens, 4)
      rows = config.train.prompts_per_step * config.sampling.num_samples
      self.assertEqual(rows, 32)  # runlocal
    self.assertEqual(arithmetic.get_config("preset=ppo").train.prompts_per_step, 512)
    # The demo is the grpo case, with its own step count.
    demo, grpo = grpo_arithmetic.get_config(), arithmetic.get_config("preset=grpo,steps=200")
    self.assertEqual(demo.to_json(), grpo.to_json())
    with self.assertRaisesRegex(ValueError, "preset='sft': expected one of grpo, "):
      arithmetic.get_config("preset=sft")

  def test_dr_grpo_norm_length_follows_max_new_tokens(self):
    path = os.path.join(CONFIG_DIR, "dr_grpo.py")
    config = load_with_flags(["prog", f"--config={path}", "--config.sampling.max_new_tokens=1000"])
    self.assertEqual(config.algo.loss.norm_length, 1000)
    dapo = load_with_flags(["prog", f"--config={os.path.join(CONFIG_DIR, 'dapo.py')}",
                            "--config.sampling.max_new_tokens=1000"])
    self.assertEqual((dapo.algo.overlong.max_len, dapo.algo.overlong.cache_len), (1000, 200))

  @parameterized.parameters(*CONFIG_NAMES)
  def test_policy_loss_jits(self, name):
    algo = get_config(name).algo
    key = jax.random.PRNGKey(0)
    logp = -jax.random.uniform(key, (4, 6))
    old = logp + 0.1 * jax.random.normal(jax.random.fold_in(key, 1), (4, 6))
    ref = logp + 0.1 * jax.random.normal(jax.random.fold_in(key, 2), (4, 6))
    mask = (jnp.arange(6)[None, :] < jnp.array([6, 3, 1, 4])[:, None]).astype(jnp.float32)
    fn = jax.jit(jax.value_and_grad(
        functools.partial(objectives.policy_loss, cfg=algo, ref_logp=ref,
                          entropy=jnp.ones((4, 6)), teacher_logp=ref - 0.5), has_aux=True))
    (loss, metrics), grad = fn(logp, old, jnp.array([1.0, -0.5, 0.25, -1.0]), mask)
    self.assertTrue(np.isfinite(float(loss)))
    self.assertTrue(np.all(np.isfinite(grad)))
    for key_ in ("approx_kl", "ratio_mean", "ratio_min", "ratio_max", "kl_ref", "entropy"):
      self.assertIn(key_, metrics)
    if algo.loss.trust_region in ("clip", "cispo", "gmpo") and algo.loss.pg_coef:
      self.assertIn("clip_frac", metrics)
    if algo.loss.trust_region in ("dppo_tv", "ipo"):
      self.assertIn("prob_mask_frac", metrics)
    if algo.distill.coef:
      self.assertGreater(float(metrics["distill_loss"]), 0.0)


if __name__ == "__main__":
  absltest.main()
