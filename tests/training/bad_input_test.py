"""The bad-input catalog (issue #7): each bad input, given to the public entry points
(`training.train(config, workdir)` or the `launch.train` command line), stops the run with
a message that names the field, the value and what was expected, before any training step.
"""
import glob
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from unittest import mock

import jax
import pytest
from absl.testing import absltest, parameterized

from configs import smoke
from jaxrl_llm import training
from jaxrl_llm.data import char_tokenizer
from jaxrl_llm import config as config_lib
from tests import cli_runs
from tests import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_REWARDS = "tests.rewards.fake_rewards"


def small_config():
  """The smoke config cut to one step, no eval, no intermediate checkpoints."""
  config = smoke.get_config()
  config.train.steps = 1
  config.train.eval_every = 0
  config.checkpoint.every = 0
  return config


def train_env(devices=None):
  """The environment of `python -m launch.train`: the CPU (`devices` fake CPU devices, or as
  many as this session has)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  if devices is not None:
    env["XLA_FLAGS"] = xla_flags.for_devices(devices)
  return env


def run_train(flags, devices=None):
  """`python -m launch.train FLAGS` in the repository, on the CPU: a process (its exit
  status, stdout, stderr), forked from one that has the libraries imported already
  (tests/cli_runs.py; `CliRunsTest` checks that a fresh interpreter's run is the same)."""
  return cli_runs.run("launch.train", flags, env=train_env(devices), cwd=REPO, timeout=600)


def run_train_fresh(flags):
  """`python -m launch.train FLAGS` in a fresh interpreter."""
  return subprocess.run([sys.executable, "-m", "launch.train", *flags], cwd=REPO,
                        capture_output=True, text=True, timeout=600, env=train_env())


def write_jsonl(path, prompts):
  with open(path, "w") as f:
    f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
  return path


class CatalogTest(parameterized.TestCase):
  """Shared checks: what a refused run may and may not leave behind."""

  def new_workdir(self):
    return os.path.join(self.create_tempdir().full_path, "run")  # not created yet

  def assert_refused_untouched(self, config, error, message):
    """A config check: refused before the workdir is even created."""
    workdir = self.new_workdir()
    with self.assertRaisesRegex(error, message):
      training.train(config, workdir)
    self.assertFalse(os.path.exists(workdir))

  def assert_refused_before_a_step(self, config, error, message):
    """A check that needs the data, the model or a first rollout: it fails before step 1."""
    workdir = self.new_workdir()
    with self.assertRaisesRegex(error, message):
      training.train(config, workdir)
    self.assert_no_step(workdir)

  def assert_no_step(self, workdir, rows=0, checkpoints=()):
    """Only `rows` metrics rows and the `checkpoints` steps are there (a fresh run: none)."""
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path) if os.path.exists(path) else open(os.devnull) as f:
      self.assertLen(f.read().splitlines(), rows)
    ckpts = os.path.join(workdir, "checkpoints")
    saved = sorted(os.listdir(ckpts)) if os.path.isdir(ckpts) else []
    self.assertEqual(saved, [str(s) for s in checkpoints])


class CliRunsTest(CatalogTest):
  """The command-line runs here are forked from a process with the libraries imported
  (tests/cli_runs.py); a fresh interpreter's run of a refused config value is the same: exit
  status 2, stdout and the one line on stderr."""

  def test_a_fresh_interpreter_gives_the_same_run(self):
    workdir = self.new_workdir()
    flags = [f"--workdir={workdir}", "--config=configs/smoke.py", "--config.optimizer.lr=-1"]
    fresh, forked = run_train_fresh(flags), run_train(flags)
    self.assertEqual((forked.returncode, forked.stdout, forked.stderr),
                     (fresh.returncode, fresh.stdout, fresh.stderr))
    self.assertEqual(fresh.returncode, 2, fresh.stderr)
    self.assertEqual(fresh.stderr, "config.optimizer.lr=-1.0: expected a positive learning rate\n")
    self.assertFalse(os.path.exists(workdir))


# --- 1. unknown or mistyped config keys ----------------------------------------------------------
class ConfigKeysTest(CatalogTest):

  @parameterized.named_parameters(
      # Presets are locked: ml_collections refuses the key while absl parses the flags.
      ("mistyped_field", ["--config=configs/smoke.py", "--config.train.stepz=3"], re.escape(
          "--config.train.stepz=3: config.train.stepz is not a known key; "
          "did you mean config.train.steps?")),
      ("mistyped_group", ["--config=configs/smoke.py", "--config.trian.steps=3"], re.escape(
          "--config.trian.steps=3: config.trian is not a known key; did you mean config.train?")),
      ("bad_value", ["--config=configs/smoke.py", "--config.train.steps=abc"],
       r"flag --config.train.steps=abc: invalid literal for int\(\)"),
      ("argument_smoke_does_not_take", ["--config=configs/smoke.py:runlocal"],
       r"Unknown config argument 'runlocal'; valid: \[\]"),
      ("unknown_preset", ["--config=configs/arithmetic.py:preset=grpp"],
       r"preset='grpp': expected one of grpo, "),
      ("missing_config_file", ["--config=configs/nonexistent.py"],
       r"config file 'configs/nonexistent.py' does not exist"),
  )
  def test_command_line(self, flags, message):
    workdir = self.new_workdir()
    run = run_train([f"--workdir={workdir}", *flags])
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertRegex(run.stderr, message)
    self.assertNotIn("Traceback", run.stderr)  # one clear line, not a stack
    self.assertFalse(os.path.exists(workdir))

  @parameterized.named_parameters(
      ("missing_file", "configs/nope.py", "--config=configs/nope.py: config file "
       "'configs/nope.py' does not exist: expected an existing file (path/to/file.py[:arg]) "
       "or a preset name, one of arithmetic, cispo, "),
      ("missing_file_with_an_argument", "configs/nope.py:runlocal", "--config=configs/nope.py:"
       "runlocal: config file 'configs/nope.py' does not exist: expected an existing file"),
      ("unknown_preset_name", "nope", "--config=nope: config 'nope' is neither a file nor a "
       "preset name: expected one of arithmetic, cispo, "),
  )
  def test_config_that_is_not_there_is_one_line(self, value, message):
    workdir = self.new_workdir()
    run = run_train([f"--workdir={workdir}", f"--config={value}"])
    self.assertEqual(run.returncode, 2, run.stderr)
    lines = run.stderr.strip().splitlines()
    self.assertLen(lines, 1, run.stderr)
    self.assertStartsWith(lines[0], message)
    self.assertFalse(os.path.exists(workdir))

  @parameterized.named_parameters(
      ("negative_learning_rate", ["--config.optimizer.lr=-1"],
       "config.optimizer.lr=-1.0: expected a positive learning rate"),
      ("missing_model_path", ["--config.model.path=/no/such/model"],
       "config.model.path='/no/such/model': model path '/no/such/model' does not exist or is "
       "not a directory (expected a "),
      ("log_every_zero", ["--config.train.log_every=0"],
       "config.train.log_every=0: expected a positive integer"),
      ("checkpoint_keep_zero", ["--config.checkpoint.keep=0"],
       "config.checkpoint.keep=0: expected >= 1"),
      ("sampling_top_p_zero", ["--config.sampling.top_p=0"],
       "config.sampling.top_p=0.0: expected 0 < top_p <= 1 (1 = off)"),
      ("unknown_dtype", ["--config.model.dtype=bf16"],
       "config.model.dtype='bf16': expected one of ['float32', 'bfloat16', 'float16']"),
  )
  def test_config_value_on_the_command_line(self, flags, message):
    """A value the validation refuses: exit 2 and exactly one line, before the workdir exists."""
    self.assert_refused_on_the_command_line(flags, message)

  def test_config_value_on_the_command_line_mesh_does_not_fit(self):
    """The command run on 8 CPU devices (its own XLA_FLAGS), whatever this session has."""
    self.assert_refused_on_the_command_line(
        ["--config.mesh.data=3"],
        "config.mesh (data=3, fsdp=1, expert=1, context=1, tensor=1) needs 3 devices; there are "
        "8: expected sizes whose product is 8 (or one axis -1 for the rest)", devices=8)

  def assert_refused_on_the_command_line(self, flags, message, devices=None):
    workdir = self.new_workdir()
    run = run_train([f"--workdir={workdir}", "--config=configs/smoke.py", *flags], devices)
    self.assertEqual(run.returncode, 2, run.stderr)
    lines = run.stderr.strip().splitlines()
    self.assertLen(lines, 1, run.stderr)
    self.assertStartsWith(lines[0], message)
    self.assertFalse(os.path.exists(workdir))

  def test_the_config_is_validated_once(self):
    """`train` validates (the command line does not again), once, before anything loads."""
    from jaxrl_llm.training import setup as setup_lib  # pylint: disable=g-import-not-at-top
    order = []
    def validate(*args, **kwargs):
      order.append("validate")
      return real_validate(*args, **kwargs)
    def set_up(*args, **kwargs):
      order.append("set_up")
      raise RuntimeError("stop")
    real_validate = config_lib.validate
    with mock.patch.object(config_lib, "validate", validate), \
         mock.patch.object(setup_lib, "set_up", set_up):
      with self.assertRaisesRegex(RuntimeError, "stop"):
        training.train(small_config(), self.new_workdir())
    self.assertEqual(order, ["validate", "set_up"])

  def test_unwritable_workdir_on_the_command_line(self):
    parent = os.path.join(self.create_tempdir().full_path, "a_file")
    with open(parent, "w") as f:
      f.write("x")
    run = run_train([f"--workdir={parent}/run", "--config=configs/smoke.py"])
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertLen(run.stderr.strip().splitlines(), 1)
    self.assertRegex(run.stderr, re.escape(f"workdir '{parent}/run' cannot be written ("))

  @parameterized.named_parameters(
      ("missing_file", None, "JSONL data file '{path}' does not exist"),
      ("empty_file", "", "JSONL data file '{path}' holds no records"),
      ("malformed_json", '{"prompt": "1+1="\n', "{path}:1: not valid JSON"),
      ("no_prompt_field", '{"question": "1+1="}\n', "{path}:1: the object has no 'prompt' field"),
  )
  def test_bad_data_is_a_usage_error(self, text, message):
    """Found before any model loads: exit 2 and one line, nothing written."""
    directory = self.create_tempdir().full_path
    path = os.path.join(directory, "data.jsonl")
    if text is not None:
      with open(path, "w") as f:
        f.write(text)
    workdir = self.new_workdir()
    run = run_train([f"--workdir={workdir}", "--config=configs/smoke.py",
                     f"--config.data.source=jsonl:{path}"])
    self.assertEqual(run.returncode, 2, run.stderr)
    lines = run.stderr.strip().splitlines()
    self.assertLen(lines, 1, run.stderr)
    self.assertIn(message.format(path=path), lines[0])
    self.assertFalse(os.path.exists(os.path.join(workdir, "metrics.jsonl")))

  def test_error_once_training_started_is_one_line_and_error_log(self):
    """A reward that fails at step 3: exit 1, one line naming the cause, the traceback in
    WORKDIR/error.log (on screen too with --verbose)."""
    workdir = self.new_workdir()
    flags = [f"--workdir={workdir}", "--config=configs/smoke.py", "--config.train.steps=4",
             "--config.rewards.functions=('tests.training.test_rewards:fail_on_third_call',)",
             "--config.rewards.weights=(1.0,)"]
    run = run_train(flags)
    self.assertEqual(run.returncode, 1, run.stderr)
    self.assertNotIn("Traceback", run.stderr)
    last = run.stderr.strip().splitlines()[-1]
    self.assertRegex(last, r"^the run failed: RewardError: .*fail_on_third_call.*raised "
                     r"RuntimeError: reward service down.*; caused by RuntimeError: reward "
                     r"service down \(traceback in .*error\.log\)$")
    with open(os.path.join(workdir, "error.log")) as f:
      self.assertIn("Traceback (most recent call last)", f.read())
    verbose = run_train([f"--workdir={self.new_workdir()}", "--verbose", *flags[1:]])
    self.assertEqual(verbose.returncode, 1)
    self.assertIn("Traceback (most recent call last)", verbose.stderr)

  @parameterized.named_parameters(
      ("close_match", "train", "stepz", re.escape(
          "config.train.stepz is not a known key; did you mean config.train.steps?")),
      ("nested", "algo.loss", "clip_hgih", re.escape(
          "config.algo.loss.clip_hgih is not a known key; did you mean config.algo.loss.clip_high?")),
      ("no_close_match", "optimizer", "nesterov", re.escape(
          "config.optimizer.nesterov is not a known key; expected one of [") + r".*'lr'.*\]"),
  )
  def test_unknown_key_in_a_config_object(self, group, key, message):
    config = small_config()
    config.unlock()  # as a config built by hand would be
    node = config
    for part in group.split("."):
      node = node[part]
    node[key] = 3
    self.assert_refused_untouched(config, ValueError, message)

  def test_unknown_key_of_a_dotted_path(self):
    self.assertIsNone(config_lib.unknown_key("train.steps"))
    self.assertIsNone(config_lib.unknown_key("data.task_options.max_value"))  # free-form group
    self.assertEqual(config_lib.unknown_key("algo.loss.clip_hgih"),
                     "config.algo.loss.clip_hgih is not a known key; "
                     "did you mean config.algo.loss.clip_high?")
    self.assertIsNone(config_lib.unknown_key("train.steps.x"))  # below a field: not a key error

  def test_missing_key(self):
    config = small_config()
    config.unlock()
    del config.train["steps"]
    self.assert_refused_untouched(
        config, ValueError,
        re.escape("config.train.steps is missing; jaxrl_llm.config.base_config() sets it"))

  def test_group_replaced_by_a_value(self):
    config = small_config()
    config.unlock()
    del config["checkpoint"]  # an unlocked ConfigDict still keeps a field's type
    config.checkpoint = 5
    self.assert_refused_untouched(
        config, ValueError, re.escape("config.checkpoint=5: expected a group with keys ["))

  def test_every_preset_has_the_schemas_keys(self):
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "configs", "*.py"))
                   if os.path.basename(p) not in ("common.py", "__init__.py"))
    self.assertIn("grpo_arithmetic", names)  # a preset with free-form task_options
    for name in names:
      module = importlib.import_module(f"configs.{name}")
      for arg in (None,) if name == "smoke" else (None, "runlocal"):
        config_lib.check_known_keys(module.get_config(arg))


# --- 2. invalid values ---------------------------------------------------------------------------
class ValuesTest(CatalogTest):

  def test_negative_learning_rate(self):
    config = small_config()
    config.optimizer.lr = -1e-3
    self.assert_refused_untouched(
        config, ValueError, re.escape("config.optimizer.lr=-0.001: expected a positive learning rate"))

  @parameterized.parameters("grpo", "rloo", "dr_grpo")
  def test_group_estimator_needs_two_samples(self, estimator):
    config = small_config()
    config.algo.advantage.estimator = estimator
    config.sampling.num_samples = 1
    config.train.prompts_per_step = 8
    self.assert_refused_untouched(config, ValueError, re.escape(
        f"algo.advantage.estimator = {estimator!r} is a group estimator and needs "
        "G = sampling.num_samples >= 2, got 1."))

  @parameterized.named_parameters(
      ("product_is_not_the_device_count", dict(data=3, fsdp=1, tensor=1),
       "config.mesh (data=3, fsdp=1, expert=1, context=1, tensor=1) needs 3 devices; there are "
       "8: expected sizes whose product is 8"),
      ("rest_axis_does_not_divide", dict(data=-1, fsdp=3, tensor=1),
       "config.mesh (data=-1, fsdp=3, expert=1, context=1, tensor=1): the other axes (3 "
       "devices) do not divide the 8 devices"),
  )
  @pytest.mark.mesh
  def test_mesh_shape(self, shape, message):
    self.assertEqual(jax.device_count(), 8)
    config = small_config()
    config.mesh.update(shape)
    self.assert_refused_untouched(config, ValueError, re.escape(message))

  @parameterized.named_parameters(
      # 3 prompts x 2 samples = 6 rows over data=8.
      ("data_axis", dict(data=-1, fsdp=1, tensor=1), 3, 2, "6 rollout rows", 8,
       "data=8 x fsdp=1 x expert=1"),
      # 2 rows would split over data=2 alone; the 'batch' rule adds fsdp=4.
      ("data_and_fsdp_axes", dict(data=2, fsdp=4, tensor=1), 1, 2, "2 rollout rows", 8,
       "data=2 x fsdp=4 x expert=1"),
  )
  @pytest.mark.mesh
  def test_batch_not_divisible_by_the_batch_shards(self, shape, P, G, rows, shards, sizes):
    config = small_config()
    config.mesh.update(shape)
    config.train.prompts_per_step, config.sampling.num_samples = P, G
    self.assert_refused_untouched(config, ValueError, re.escape(
        f"config.train.prompts_per_step={P} x config.sampling.num_samples={G} = {rows} do not "
        f"split over the {shards} batch shards of the mesh ({sizes}, the axes config.mesh.rules "
        f"maps 'batch' to): expected a multiple of {shards}"))

  @pytest.mark.mesh
  def test_batch_shards_follow_the_rules(self):
    config = small_config()
    config.mesh.update(data=2, fsdp=4, tensor=1)
    config.train.prompts_per_step, config.sampling.num_samples = 1, 2
    with self.assertRaisesRegex(ValueError, "batch shards"):
      config_lib.validate(config)
    config.mesh.rules = tuple(("batch", "data") if name == "batch" else (name, axes)
                              for name, axes in config.mesh.rules)
    config_lib.validate(config)  # 2 rows over data=2 alone

  def test_prompts_per_step_over_processes(self):
    config = small_config()
    with mock.patch.object(jax, "process_count", return_value=3):
      self.assert_refused_untouched(config, ValueError, re.escape(
          "config.train.prompts_per_step=2 is not divisible by the 3 processes: expected a "
          "multiple of 3"))

  def test_unknown_prompt_overflow_mode(self):
    config = small_config()
    config.data.prompt_overflow = "trunc"
    self.assert_refused_untouched(config, ValueError, re.escape(
        "config.data.prompt_overflow='trunc': expected one of ['error', 'truncate']"))


# --- 3. the model path ---------------------------------------------------------------------------
NOT_A_DIRECTORY = ("config.model.path={path!r}: model path {path!r} does not exist or is not a "
                   "directory (expected a Hugging Face model directory, local or gs://, with "
                   "config.json and safetensors weights)")


class ModelPathTest(CatalogTest):

  @parameterized.named_parameters(
      ("does_not_exist", {}, "no_such_model", config_lib.ConfigError, NOT_A_DIRECTORY),
      ("a_file", {"model.bin": "x"}, "model.bin", config_lib.ConfigError, NOT_A_DIRECTORY),
      ("no_config_json", {"pytorch_model.bin": "x"}, "", config_lib.ConfigError,
       "config.model.path={path!r}: {path!r} has no config.json: not a Hugging Face model "
       "directory (it holds ['pytorch_model.bin'])"),
      ("no_safetensors_weights", {"config.json": '{"model_type": "llama"}'}, "",
       config_lib.ConfigError, "config.model.path={path!r}: no weights in {path!r}: expected "
       "model.safetensors or model.safetensors.index.json (safetensors)"),
      ("unsupported_architecture", {"config.json": '{"model_type": "gpt2"}',
                                    "model.safetensors": ""}, "", config_lib.ConfigError,
       "config.model.path={path!r}: config.json model_type='gpt2' is not supported"),
  )
  def test_model_path(self, files, name, error, message):
    directory = self.create_tempdir().full_path
    for file, text in files.items():
      with open(os.path.join(directory, file), "w") as f:
        f.write(text)
    config = small_config()
    config.model.path = path = os.path.join(directory, name) if name else directory
    self.assert_refused_untouched(config, error, re.escape(message.format(path=path)))


# --- 4. a tokenizer that does not fit the model ---------------------------------------------------
class TokenizerTest(CatalogTest):

  def test_built_in_tokenizer_larger_than_the_vocabulary(self):
    config = small_config()
    config.model.arch.vocab_size = 64
    self.assert_refused_untouched(config, ValueError, re.escape(
        "config.model.arch.vocab_size=64 is smaller than the built-in character tokenizer's 99 "
        "tokens: expected >= 99"))

  def test_tokenizer_path_does_not_exist(self):
    config = small_config()
    config.model.tokenizer_path = path = os.path.join(self.create_tempdir().full_path, "tok")
    self.assert_refused_untouched(config, config_lib.ConfigError, re.escape(
        f"config.model.tokenizer_path={path!r} is not a directory"))

  def test_tokenizer_larger_than_the_vocabulary(self):
    config = small_config()
    config.model.tokenizer_path = path = os.path.join(self.create_tempdir().full_path, "tok")
    char_tokenizer.build_char_tokenizer(path, vocab_size=600)
    self.assert_refused_before_a_step(config, ValueError, re.escape(
        f"config.model.tokenizer_path={path!r} has 600 tokens but the model's vocab_size "
        "(config.model.arch.vocab_size) is 512: expected a tokenizer of at most 512 tokens"))


# --- 5. an empty dataset -------------------------------------------------------------------------
class EmptyDatasetTest(CatalogTest):

  def test_empty_jsonl(self):
    config = small_config()
    path = write_jsonl(os.path.join(self.create_tempdir().full_path, "empty.jsonl"), [])
    config.data.source = f"jsonl:{path}"
    self.assert_refused_before_a_step(config, ValueError, re.escape(
        f"config.data.source='jsonl:{path}' (split 'train'): JSONL data file {path!r} holds no "
        "records: expected one JSON object with a 'prompt' field per line."))


# --- 7. a reward function that misbehaves --------------------------------------------------------
class RewardTest(CatalogTest):

  @parameterized.named_parameters(
      ("raises", "raises_on_batches", re.escape(
          "raised RuntimeError: batch too large on a batch of 8 samples (no single sample fails "
          "alone).")),
      ("returns_nan", "nan_on_second", r"returned nan for sample 1 \(prompt='.*', "
       r"completion='.*'\); rewards must be finite real numbers\."),
      ("too_few_values", "drops_last", r"returned 7 values for 8 samples; the values stop before "
       r"sample 7 \(prompt=.*\); expected one per sample\."),
  )
  def test_bad_reward(self, fn, message):
    config = small_config()
    config.rewards.functions = (f"{FAKE_REWARDS}:{fn}",)
    config.rewards.weights = (1.0,)
    self.assert_refused_before_a_step(config, ValueError, re.escape(
        f"Reward function '{FAKE_REWARDS}:{fn}' (config.rewards.functions) ") + message)


# --- 7b. reward functions and environments named by import path --------------------------
EXPECTED_IMPORT = ': expected "pkg.module:function" or "path/to/file.py:function" naming a function'
ARITHMETIC_EXACT = "jaxrl_llm.rewards.arithmetic:arithmetic_exact"


class ImportPathAndRewardsTest(CatalogTest):
  """Each one line on the command line, exit 2, before anything loads."""

  def assert_one_line(self, flags, message):
    workdir = self.new_workdir()
    run = run_train([f"--workdir={workdir}", *flags])
    self.assertEqual(run.returncode, 2, run.stderr)
    lines = run.stderr.strip().splitlines()
    self.assertLen(lines, 1, run.stderr)
    self.assertEqual(lines[0], message)
    self.assertFalse(os.path.exists(os.path.join(workdir, "metrics.jsonl")))  # no step

  @parameterized.named_parameters(
      ("reward_function", ["--config=configs/smoke.py", "--config.rewards.functions=("
                           "'no_such_pkg.rewards:exact',)", "--config.rewards.weights=(1.0,)"],
       "config.rewards.functions[0]='no_such_pkg.rewards:exact': Import path names module "
       "'no_such_pkg.rewards', which cannot be imported: No module named 'no_such_pkg'"),
      ("environment", ["--config=configs/smoke.py", "--config.data.env=no_such_pkg.envs:Env"],
       "config.data.env='no_such_pkg.envs:Env': Import path names module 'no_such_pkg.envs', "
       "which cannot be imported: No module named 'no_such_pkg'"),
      ("a_sources_reward_function", [
          "--config=configs/arithmetic.py:preset=mixed,runlocal",
          "--config.sources.rl.rewards.functions=('jaxrl_llm.rewards.arithmetic:exact',)",
          "--config.sources.rl.rewards.weights=(1.0,)"],
       "config.sources.rl.rewards.functions[0]='jaxrl_llm.rewards.arithmetic:exact': Import "
       "path 'jaxrl_llm.rewards.arithmetic:exact': 'jaxrl_llm.rewards.arithmetic' has no "
       "attribute 'exact'"),
  )
  def test_import_path_error_names_the_field(self, flags, message):
    self.assert_one_line(flags, message + EXPECTED_IMPORT + " that exists")

  @parameterized.named_parameters(
      ("run", ["--config=configs/smoke.py"], "config.rewards", "config.data", "config.algo"),
      ("source", ["--config=configs/arithmetic.py:preset=mixed,runlocal"],
       "config.sources.rl.rewards", "config.sources.rl", "config.sources.rl.algo"),
  )
  def test_no_reward_functions_without_another_signal(self, flags, rewards, source, algo):
    self.assert_one_line(
        [*flags, f"--{rewards}.functions=()", f"--{rewards}.weights=()"],
        f"{rewards}.functions=(): expected reward functions (import paths such as "
        f"'{ARITHMETIC_EXACT}'): nothing else gives these rows a training signal (no "
        f"environment in {source}.env, no teacher: {algo}.distill.coef and shaping_coef are 0)")

  def test_a_field_a_reward_function_reads_is_missing(self):
    """The smoke run's arithmetic reward reads `answer`: records without one are refused
    before the model loads (they would fail at step 1)."""
    path = write_jsonl(os.path.join(self.create_tempdir().full_path, "data.jsonl"),
                       ["1+1=", "2+2="])
    self.assert_one_line(
        ["--config=configs/smoke.py", f"--config.data.source=jsonl:{path}"],
        f"config.data.source='jsonl:{path}' (split 'train'): reward function "
        f"'{ARITHMETIC_EXACT}' (config.rewards.functions) reads the field 'answer', which "
        "record 0 lacks (its fields: ['prompt']): expected records with 'answer', or other "
        "reward functions")


# --- 8. a workdir that cannot be written ---------------------------------------------------------
class WorkdirTest(CatalogTest):

  def test_parent_is_a_file(self):
    parent = os.path.join(self.create_tempdir().full_path, "a_file")
    with open(parent, "w") as f:
      f.write("x")
    workdir = os.path.join(parent, "run")
    with self.assertRaisesRegex(ValueError, re.escape(
        f"workdir {workdir!r} cannot be written (NotADirectoryError: ") + r".*" + re.escape(
            "expected a directory this process can create and write to")):
      training.train(small_config(), workdir)

  @absltest.skipIf(hasattr(os, "geteuid") and os.geteuid() == 0, "root writes anywhere")
  def test_read_only_directory(self):
    workdir = self.create_tempdir().full_path
    os.chmod(workdir, 0o500)
    self.addCleanup(os.chmod, workdir, 0o700)
    with self.assertRaisesRegex(ValueError, re.escape(
        f"workdir {workdir!r} cannot be written (PermissionError: ")):
      training.train(small_config(), workdir)
    self.assertEqual(os.listdir(workdir), [])


# --- 6. prompts longer than the limit ------------------------------------------------------------
def long_prompt_config(directory, overflow):
  """Every prompt is 40 characters (= 40 tokens); the smoke limit is 32."""
  config = small_config()
  path = write_jsonl(os.path.join(directory, "long.jsonl"), [f"{i:02d}" + "x" * 38 for i in range(8)])
  config.data.source = f"jsonl:{path}"
  config.data.prompt_overflow = overflow
  config.rewards.functions = ("tests.training.test_rewards:count_a",)
  config.rewards.weights = (1.0,)
  return config


class PromptOverflowAndResumeTest(CatalogTest):
  """One finished one-step run (its prompts truncated) serves 6 ('truncate') and 9."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = os.path.join(absltest.get_default_test_tmpdir(), "bad_input_finished_run")
    shutil.rmtree(cls.root, ignore_errors=True)
    os.makedirs(cls.root)
    cls.config = long_prompt_config(cls.root, "truncate")
    cls.workdir = os.path.join(cls.root, "run")
    training.train(cls.config, cls.workdir)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def test_error_names_the_prompt_and_the_limit(self):
    config = long_prompt_config(self.create_tempdir().full_path, "error")
    self.assert_refused_before_a_step(
        config, ValueError, r"Prompt of sample 0 \(dataset index \d\) is 40 tokens, longer than "
        r"config\.data\.max_prompt_len=32: '0\dx+'")

  def test_truncate_counts_the_prompts(self):
    with open(os.path.join(self.workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    self.assertEqual([r["step"] for r in rows], [1])
    self.assertEqual(rows[0]["prompts_truncated"], self.config.train.prompts_per_step)

  # --- 9. a checkpoint from an incompatible config -----------------------------------------------
  def test_incompatible_checkpoint(self):
    workdir = self.new_workdir()
    shutil.copytree(self.workdir, workdir)
    config = long_prompt_config(self.create_tempdir().full_path, "truncate")
    config.model.arch.hidden_size, config.model.arch.head_dim = 32, 8
    config.train.steps = 2
    with self.assertRaisesRegex(config_lib.ConfigError, r"the checkpoint at step 1 in .* was written by an "
                                r"incompatible config: model.head_dim: 16 in the checkpoint, 8 in "
                                r"this config; model.hidden_size: 64 in the checkpoint, 32 in this "
                                r"config; expected the same model \(or a fresh workdir\)$"):
      training.train(config, workdir)
    self.assert_no_step(workdir, rows=1, checkpoints=[1])

  def test_another_algorithm_is_refused_and_the_workdir_untouched(self):
    workdir = self.new_workdir()
    shutil.copytree(self.workdir, workdir)
    before = _file_digests(workdir)
    config = long_prompt_config(self.create_tempdir().full_path, "truncate")
    config.algo.kl.coef, config.train.steps = 0.0, 2
    with self.assertRaisesRegex(config_lib.ConfigError, re.escape(
        "was written by another algorithm or model: config.algo.kl.coef: 0.04 in the "
        "checkpoint, 0.0 in this config; expected the same config.algo and config.model (pass "
        "--resume_with_changes to resume with these changes, or use a fresh workdir)")):
      training.train(config, workdir)
    self.assertEqual(_file_digests(workdir), before)  # config.json, metrics, checkpoints
    # On purpose: the run resumes from step 1 with the new algorithm.
    training.train(config, workdir, resume_with_changes=True)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      self.assertEqual([json.loads(line)["step"] for line in f], [1, 2])
    with open(os.path.join(workdir, "config.json")) as f:
      self.assertEqual(json.load(f)["algo"]["kl"]["coef"], 0.0)


def _file_digests(directory):
  """{relative path: sha256} of every file under `directory`."""
  import hashlib  # pylint: disable=g-import-not-at-top
  digests = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        digests[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return digests


if __name__ == "__main__":
  absltest.main()
