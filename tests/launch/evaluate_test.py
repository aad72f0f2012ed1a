"""`launch.evaluate`: a saved policy's greedy pass@1, pass@k, maj@K and mean reward, from a
Hugging Face directory (the demo's shipped warm start) or a training workdir's checkpoint."""
import json
import os
import shutil
import tempfile

import jax
import numpy as np
from absl.testing import absltest

from configs import arithmetic as arithmetic_presets
from configs import grpo_arithmetic
from jaxrl_llm import assets, models, training
from jaxrl_llm import config as config_lib
from jaxrl_llm import sharding as sh
from jaxrl_llm.rewards import arithmetic
from jaxrl_llm.training import answers, checkpoint_eval, pass_at_k, saved_policy
from tests import cli_runs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_EVAL = 12  # records of the eval split: small, so the test is fast
CONFIG_FLAGS = ["--config=configs/grpo_arithmetic.py:runlocal",
                f"--config.data.task_options.num_eval={NUM_EVAL}"]
SOURCE = "default"  # a one-source run's name in the outputs
KEYS = {"records", "pass@1_greedy", "pass@1", "pass@2", "pass@4", "maj@4", "reward_mean",
        "reward_mean_greedy"}


def small_config():
  config = grpo_arithmetic.get_config("runlocal")
  config.data.task_options.num_eval = NUM_EVAL
  config.logging.trackers = ("jsonl",)
  return config


def run_evaluate(flags):
  """`python -m launch.evaluate FLAGS` in the repository, on the CPU: a process (its exit
  status, stdout, stderr), forked from one that has the libraries imported already
  (tests/cli_runs.py)."""
  return cli_runs.run("launch.evaluate", flags, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                      cwd=REPO, timeout=300)


def read_outputs(output):
  with open(os.path.join(output, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(output, "eval.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return summary, rows


class WarmStartTest(absltest.TestCase):

  def test_command_end_to_end(self):
    output = self.create_tempdir().full_path
    run = run_evaluate([*CONFIG_FLAGS, f"--model={assets.path('arithmetic_sft')}",
                        "--samples=4", f"--output={output}"])
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    self.assertIn("pass@1_greedy", run.stdout)  # the table
    self.assertIn(SOURCE, run.stdout)
    summary, rows = read_outputs(output)
    self.assertEqual((summary["split"], summary["num_samples"], summary["step"]), ("eval", 4, None))
    metrics = summary["sources"][SOURCE]
    self.assertEqual(set(metrics), KEYS)
    self.assertEqual(metrics["records"], NUM_EVAL)
    self.assertEqual([r["index"] for r in rows], list(range(NUM_EVAL)))  # every record, once
    ks = [metrics[f"pass@{k}"] for k in (1, 2, 4)]
    self.assertEqual(sorted(ks), ks)  # non-decreasing in k
    correct = np.asarray([r["correct"] for r in rows])
    self.assertEqual(correct.shape, (NUM_EVAL, 4))
    self.assertAlmostEqual(metrics["pass@1"], correct.mean(), places=9)  # sampled pass@1
    self.assertAlmostEqual(metrics["pass@4"], correct.any(axis=1).mean(), places=9)  # k = n
    self.assertAlmostEqual(metrics["pass@1_greedy"],
                           np.mean([r["greedy_correct"] for r in rows]), places=9)
    self.assertAlmostEqual(metrics["maj@4"], np.mean(
        [pass_at_k.majority_correct(r["answers"], r["correct"]) for r in rows]), places=9)
    self.assertAlmostEqual(metrics["reward_mean"],
                           np.mean([r["rewards"] for r in rows]), places=6)
    for r in rows:  # each sample scored by the task's rewards, its answer by the task's parser
      self.assertEqual(r["source"], SOURCE)
      self.assertLen(r["samples"], 4)
      exact = arithmetic.arithmetic_exact([], r["samples"], [r["fields"]["answer"]] * 4)
      self.assertEqual(r["correct"], [bool(e) for e in exact])
      self.assertEqual(r["answers"], [answers.integer_answer(s) for s in r["samples"]])
      self.assertEqual(r["greedy_correct"], arithmetic.arithmetic_exact(
          [], [r["greedy_completion"]], [r["fields"]["answer"]]) == [1.0])
    # The warm start is right on some records and wrong on others (both greedily and sampled).
    self.assertBetween(metrics["pass@1_greedy"], 0.05, 0.95)
    self.assertTrue(0 < correct.sum() < correct.size)


  def test_every_source_of_a_mixed_run(self):
    config = arithmetic_presets.get_config("preset=mixed,runlocal")
    for source in config.sources.values():
      source.task_options.num_eval = 4
    output = self.create_tempdir().full_path
    summary = checkpoint_eval.evaluate(config, assets.path("arithmetic_sft"), samples=2,
                                       output=output)
    self.assertEqual(list(summary["sources"]), ["distill", "rl"])  # config.sources' order
    _, rows = read_outputs(output)
    self.assertEqual([(r["source"], r["index"]) for r in rows],
                     [(name, i) for name in ("distill", "rl") for i in range(4)])
    # The same records, rewards and keys: the same numbers.
    self.assertEqual(summary["sources"]["distill"], summary["sources"]["rl"])
    self.assertEqual(set(summary["sources"]["rl"]), {"records", "pass@1_greedy", "pass@1",
                                                     "pass@2", "maj@2", "reward_mean",
                                                     "reward_mean_greedy"})


class WorkdirTest(absltest.TestCase):
  """A training workdir's checkpoints: two GRPO steps, each checkpointed."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workdir = os.path.join(tempfile.mkdtemp(prefix="evaluate_test_"), "run")
    config = small_config()
    config.train.steps = 2
    config.checkpoint.every = 1
    # Steps that change the policy: no warm-up (its first lr is 0), and groups enough that
    # some are neither all right nor all wrong.
    config.optimizer.warmup_steps = 0
    config.train.prompts_per_step = 16
    training.train(config, cls.workdir)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(os.path.dirname(cls.workdir), ignore_errors=True)
    super().tearDownClass()

  def test_latest_checkpoint_is_the_export(self):
    from_workdir = checkpoint_eval.evaluate(small_config(), self.workdir, samples=4)
    self.assertEqual(from_workdir["step"], 2)
    self.assertTrue(os.path.isfile(os.path.join(self.workdir, "eval_2", "summary.json")))
    # The run's last checkpoint holds the parameters it exported: the same numbers.
    output = self.create_tempdir().full_path
    exported = checkpoint_eval.evaluate(small_config(), os.path.join(self.workdir, "export"),
                                        samples=4, output=output)
    self.assertEqual(from_workdir["sources"], exported["sources"])
    self.assertEqual(set(from_workdir["sources"][SOURCE]), KEYS)
    explicit = checkpoint_eval.evaluate(small_config(), f"{self.workdir}:2", samples=4,
                                        output=output)
    self.assertEqual(explicit["sources"], exported["sources"])
    self.assertEqual(checkpoint_eval.evaluate(small_config(), f"{self.workdir}:1", samples=2,
                                              output=output)["step"], 1)

  def test_restored_parameters_are_the_exported_ones(self):
    spec = saved_policy.parse_model(self.workdir)
    step = saved_policy.pick_step(spec)
    config = saved_policy.with_model(small_config(), spec, step)
    mesh, rules = sh.split_meshes(config.mesh)[0], sh.freeze_rules(config.mesh.rules)
    _, policy = saved_policy.load_policy(config, spec, step, mesh, rules)
    restored = jax.device_get(policy.params)
    exported = models.from_pretrained(os.path.join(self.workdir, "export")).params
    jax.tree.map(np.testing.assert_array_equal, restored, exported)
    warm_start = models.from_pretrained(assets.path("arithmetic_sft")).params
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), restored,
                                         warm_start))
    self.assertTrue(any(moved))  # the run trained the policy: not the warm start's values

  def test_bad_input_is_one_line_with_status_2(self):
    model = f"--model={self.workdir}"
    cases = [
        ([*CONFIG_FLAGS, "--model=/nonexistent/model"], "--model='/nonexistent/model': "
         "'/nonexistent/model' is not a directory: expected a Hugging Face model directory"),
        ([*CONFIG_FLAGS, model, "--samples=0"],
         "--samples=0: expected a positive number of samples per record"),
        ([*CONFIG_FLAGS, f"{model}:5"],
         f"--model={self.workdir}:5: the workdir has no checkpoint of step 5: expected one of "
         "[1, 2]"),
    ]
    for flags, message in cases:
      run = run_evaluate(flags)
      self.assertEqual(run.returncode, 2, run.stderr)
      lines = run.stderr.strip().splitlines()
      self.assertLen(lines, 1, run.stderr)  # one line, no traceback
      self.assertStartsWith(lines[0], message)

  def test_refused_before_the_model_loads(self):
    cases = [
        (dict(model=os.path.join(self.workdir, "export")),
         "--output is required with --model="),
        (dict(model=self.workdir, split="nope"), "--split='nope': "),
        (dict(model=os.path.join(self.workdir, "metrics.jsonl")), "is not a directory"),
        (dict(model=self.workdir + "/checkpoints"), "expected a Hugging Face model directory"),
        (dict(model=os.path.join(self.workdir, "export") + ":1", output="/tmp/x"),
         "holds no checkpoints/, so it has no step 1"),
    ]
    for kwargs, message in cases:
      with self.assertRaisesRegex(config_lib.ConfigError, message.replace("(", r"\(")):
        checkpoint_eval.evaluate(small_config(), samples=4, **kwargs)
    config = small_config()
    config.eval.update(dict(num_samples=4, pass_k=(1, 4)))
    with self.assertRaisesRegex(config_lib.ConfigError, r"config.eval.pass_k=\(1, 4\): expected "
                                r"each k an integer in \[1, 2\].* \(--samples=2\)"):
      checkpoint_eval.evaluate(config, self.workdir, samples=2)


if __name__ == "__main__":
  absltest.main()
