"""`config.validate` called directly: good configs pass, bad ones raise one `ConfigError`
line naming the field, the value and what was expected (the command line's side of the
same errors: tests/training/bad_input_test.py)."""
import json
import os
import re

import jax
import pytest
from absl.testing import absltest, parameterized

from configs import smoke
from jaxrl_llm import config as config_lib
from jaxrl_llm.aot import chips
from jaxrl_llm.config import ConfigError, reward_checks
from jaxrl_llm.config import sources as sources_lib

ARITHMETIC_EXACT = "jaxrl_llm.rewards.arithmetic:arithmetic_exact"
SCRIPTED_ENV = os.path.join(os.path.dirname(os.path.dirname(__file__)), "training",
                            "scripted_env.py") + ":ScriptedEnv"


def no_rewards(config, group=None):
  group = config.rewards if group is None else group
  group.functions, group.weights = (), ()
  return config


class ValidateTest(parameterized.TestCase):

  def assert_refused(self, config, message, **kwargs):
    with self.assertRaises(ConfigError) as caught:
      config_lib.validate(config, **kwargs)
    self.assertEqual(str(caught.exception), message)

  @parameterized.parameters("smoke", "grpo:runlocal", "ppo:runlocal", "sft:runlocal",
                            "configs/arithmetic.py:preset=mixed,runlocal", "cispo:runlocal",
                            "gmpo:runlocal", "sapo:runlocal", "ipo:runlocal", "max_rl:runlocal")
  def test_presets_pass(self, name):
    config_lib.validate(config_lib.preset(name))

  @parameterized.named_parameters(
      ("learning_rate", "optimizer.lr", -1.0, "config.optimizer.lr=-1.0: expected a positive "
       "learning rate"),
      ("keep", "checkpoint.keep", 0, "config.checkpoint.keep=0: expected >= 1"),
      ("buckets", "sampling.prompt_buckets", (16, 0),
       "config.sampling.prompt_buckets=(16, 0): expected a tuple of positive lengths"),
      ("overflow", "data.prompt_overflow", "cut",
       "config.data.prompt_overflow='cut': expected one of ['error', 'truncate']"),
      ("minibatches", "algo.num_minibatches", 3, "config.algo.num_minibatches=3 does not divide "
       "the rollout batch of 8 sequences (train.prompts_per_step x sampling.num_samples): "
       "expected a divisor of it"),
      ("kv_pages", "sampling.kv_pages", -2, "config.sampling.kv_pages=-2: expected 0 (every "
       "slot's worst case) or at least 1 (the pages of one completion of max_new_tokens=16 in "
       "pages of page_size=32), so that the oldest running request can always grow"),
      ("prefill_chunk", "sampling.prefill_chunk", 48, "config.sampling.prefill_chunk=48: "
       "expected 0 (whole) or a positive multiple of page_size=32"),
  )
  def test_a_bad_value(self, field, value, message):
    config = smoke.get_config()
    group, key = field.split(".")
    config[group][key] = value
    self.assert_refused(config, message)

  def test_partial_rollouts_name_what_they_need(self):
    config = smoke.get_config()
    config.rollouts.partial = True
    self.assert_refused(config, "config.rollouts.partial=True: expected False, or "
                        "config.algo.max_async_level >= 1 (generations span the publishes of "
                        "the asynchronous pipeline)")
    config.algo.max_async_level = 1
    config_lib.validate(config)
    config.algo.dynamic_sampling.enabled = True
    self.assert_refused(config, "config.rollouts.partial=True: expected False, or "
                        "algo.dynamic_sampling.enabled=False (a step takes the first groups to "
                        "finish)")
    config.algo.dynamic_sampling.enabled = False
    config.sampling.top_k = 5
    self.assertRaisesRegex(ConfigError, r"rollouts.partial=True: .*top_k=5",
                           config_lib.validate, config)

  def test_a_field_left_to_the_user(self):
    self.assert_refused(config_lib.preset("opd:runlocal"), "config.teacher.path is required by "
                        "this preset: set it, e.g. --config.teacher.path=...")

  @pytest.mark.mesh
  def test_the_mesh_against_the_devices_given(self):
    config = smoke.get_config()
    config.mesh.update(data=-1, fsdp=16)
    self.assert_refused(config, "config.mesh (data=-1, fsdp=16, expert=1, context=1, tensor=1): "
                        "the other axes (16 devices) do not divide the 8 devices; expected "
                        "sizes whose product divides 8")
    config.train.prompts_per_step = 4  # 16 rows
    config_lib.validate(config, devices=chips.slice_chips("v5p:2x2x4"))  # a v5p-32's 16 chips
    config.train.prompts_per_step = 1  # 4 rows over 16 batch shards
    self.assert_refused(
        config, "config.train.prompts_per_step=1 x config.sampling.num_samples=4 = 4 rollout "
        "rows do not split over the 16 batch shards of the mesh (data=1 x fsdp=16 x expert=1, "
        "the axes config.mesh.rules maps 'batch' to): expected a multiple of 16",
        devices=chips.slice_chips("v5p:2x2x4"))
    self.assertEqual(jax.device_count(), 8)


class ImportPathTest(absltest.TestCase):

  def assert_refused(self, config, message):
    with self.assertRaises(ConfigError) as caught:
      config_lib.validate(config)
    self.assertEqual(str(caught.exception), message + ': expected "pkg.module:function" or '
                     '"path/to/file.py:function" naming a function that exists')

  def test_reward_function(self):
    config = smoke.get_config()
    config.rewards.functions = (ARITHMETIC_EXACT, "jaxrl_llm.rewards.arithmetic:exact")
    self.assert_refused(config, "config.rewards.functions[1]='jaxrl_llm.rewards.arithmetic:"
                        "exact': Import path 'jaxrl_llm.rewards.arithmetic:exact': "
                        "'jaxrl_llm.rewards.arithmetic' has no attribute 'exact'")

  def test_environment(self):
    config = smoke.get_config()
    config.data.env = "/no/such/env.py:Env"
    self.assert_refused(config, "config.data.env='/no/such/env.py:Env': Import path names file "
                        "'/no/such/env.py', which does not exist")

  def test_a_sources_reward_function(self):
    config = config_lib.preset("configs/arithmetic.py:preset=mixed,runlocal")
    config.sources.distill.rewards.functions = ("no_such_module:fn",)
    config.sources.distill.rewards.weights = (1.0,)
    self.assert_refused(config, "config.sources.distill.rewards.functions[0]='no_such_module:"
                        "fn': Import path names module 'no_such_module', which cannot be "
                        "imported: No module named 'no_such_module'")


class RewardsOptionalTest(absltest.TestCase):
  """`functions=()` where an environment, a teacher or the dataset carries the signal."""

  def test_refused_without_another_signal(self):
    with self.assertRaisesRegex(ConfigError, "^" + re.escape(
        "config.rewards.functions=(): expected reward functions (import paths such as "
        f"'{ARITHMETIC_EXACT}'): nothing else gives these rows a training signal (no "
        "environment in config.data.env, no teacher: config.algo.distill.coef and "
        "shaping_coef are 0)") + "$"):
      config_lib.validate(no_rewards(smoke.get_config()))

  def test_an_environment(self):
    config = no_rewards(smoke.get_config())
    config.data.env = SCRIPTED_ENV
    config_lib.validate(config)

  def test_a_teacher(self):
    config = config_lib.preset("opsd:runlocal")  # the policy after a hint is the teacher
    config.data.source = "task:arithmetic"
    self.assertEqual(config.rewards.functions, ())  # the preset names none
    config_lib.validate(config)

  def test_sft(self):
    config = no_rewards(config_lib.preset("sft:runlocal"))
    config_lib.validate(config)

  def test_per_source(self):
    config = config_lib.preset("configs/arithmetic.py:preset=mixed,runlocal")
    config_lib.validate(no_rewards(config, config.sources.distill.rewards))  # opd's rows: a teacher
    no_rewards(config, config.sources.rl.rewards)
    with self.assertRaisesRegex(ConfigError, "^" + re.escape(
        "config.sources.rl.rewards.functions=(): expected reward functions")):
      config_lib.validate(config)

  def test_evaluation_reports_the_first_function(self):
    config = no_rewards(smoke.get_config())
    config.data.env, config.train.eval_every = SCRIPTED_ENV, 5
    with self.assertRaisesRegex(ConfigError, "^" + re.escape(
        "config.train.eval_every=5: the held-out evaluation reports the first reward "
        "function, and config.rewards.functions is (): expected 0 (no held-out evaluation), "
        "or a reward function to evaluate with") + "$"):
      config_lib.validate(config)

  def test_dynamic_sampling_needs_rewards(self):
    config = no_rewards(config_lib.preset("opsd:runlocal"))
    config.data.source = "task:arithmetic"
    config.algo.dynamic_sampling.enabled = True
    with self.assertRaisesRegex(ConfigError, "^" + re.escape(
        "config.algo.dynamic_sampling.enabled=True keeps the groups whose rewards differ, and "
        "config.rewards.functions is () (every reward 0): expected False, or reward "
        "functions") + "$"):
      config_lib.validate(config)


class RewardFieldsTest(absltest.TestCase):
  """The fields reward functions read, checked in the records before anything loads."""

  def write(self, records):
    path = os.path.join(self.create_tempdir().full_path, "data.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in records)
    return f"jsonl:{path}"

  def test_a_missing_field(self):
    config = smoke.get_config()
    config.data.source = source = self.write([{"prompt": "1+1=", "answer": 2},
                                              {"prompt": "2+2=", "id": 7}])
    with self.assertRaises(ConfigError) as caught:
      config_lib.validate(config, data=True)
    self.assertEqual(str(caught.exception), (
        f"config.data.source={source!r} (split 'train'): reward function '{ARITHMETIC_EXACT}' "
        "(config.rewards.functions) reads the field 'answer', which record 1 lacks (its "
        "fields: ['id', 'prompt']): expected records with 'answer', or other reward functions"))

  def test_a_function_without_fields_parameter(self):
    file = os.path.join(self.create_tempdir().full_path, "my_rewards.py")
    with open(file, "w") as f:
      f.write("def exact(prompts, completions, answer):\n  return [0.0] * len(prompts)\n")
    config = smoke.get_config()
    config.rewards.functions, config.rewards.weights = (f"{file}:exact",), (1.0,)
    config.data.source = source = self.write([{"prompt": "1+1=", "answer": 2, "id": 0}])
    with self.assertRaises(ConfigError) as caught:
      config_lib.validate(config, data=True)
    self.assertEqual(str(caught.exception), (
        f"config.data.source={source!r} (split 'train'): reward function '{file}:exact' "
        "(config.rewards.functions) takes no parameter 'id', a field of record 0, and no "
        "**fields: expected a function that takes **unused_fields"))

  def test_records_with_the_fields_pass(self):
    config = smoke.get_config()
    config.data.source = self.write([{"prompt": "1+1=", "answer": 2, "id": 0}])
    config_lib.validate(config, data=True)

  def test_an_episodes_own_fields(self):
    """A multi-turn source's functions also get the episode's `turns` and `messages`."""
    config = smoke.get_config()
    config.rewards.functions = ("jaxrl_llm.rewards.calculator:calculator_valid_call",)
    config.rewards.weights = (1.0,)
    records = [{"prompt": "1+1=", "answer": 2}]
    with self.assertRaisesRegex(ConfigError, "reads the field 'messages', which record 0 lacks"):
      reward_checks.check_fields(sources_lib.run_sources(config)[0], records, "here")
    config.data.env = SCRIPTED_ENV
    reward_checks.check_fields(sources_lib.run_sources(config)[0], records, "here")


if __name__ == "__main__":
  absltest.main()
