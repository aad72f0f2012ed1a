"""rollouts.jsonl: every N-th step's completions, aligned token lists, once per step."""
import json
import os
import shutil

import jax
import numpy as np
from absl.testing import absltest

from jaxrl_llm import training
from jaxrl_llm import config as config_lib
from jaxrl_llm.training import rollout_log
from tests.training import async_configs
from tests.training.run_logs import read_jsonl


def read_rollouts(workdir):
  with open(os.path.join(workdir, rollout_log.FILE)) as f:
    return [json.loads(line) for line in f]


def config(steps=4):
  config = async_configs.golden_config(steps)  # 4 prompts x 8 samples, count_lowercase
  config.logging.rollouts_every = 2
  config.checkpoint.every = 2
  return config


class RolloutLogTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workdir = absltest.get_default_test_tmpdir() + "/rollout_log_run"
    shutil.rmtree(cls.workdir, ignore_errors=True)
    training.train(config(), cls.workdir, devices=jax.devices()[:2])
    cls.rows = read_rollouts(cls.workdir)

  def test_every_completion_of_every_second_step(self):
    self.assertEqual([r["step"] for r in self.rows], [2] * 32 + [4] * 32)
    # Synchronous: step s (1-based) was sampled by the policy after s - 1 updates.
    self.assertEqual({r["policy_version"] for r in self.rows if r["step"] == 4}, {3})
    self.assertEqual({r["source"] for r in self.rows}, {"default"})

  def test_fields_agree_with_each_other_and_the_metrics(self):
    metrics = {r["step"]: r for r in read_jsonl(self.workdir)}
    for step in (2, 4):
      rows = [r for r in self.rows if r["step"] == step]
      self.assertAlmostEqual(np.mean([r["reward"] for r in rows]), metrics[step]["reward_mean"],
                             places=5)
      self.assertAlmostEqual(np.mean([r["turn_tokens"][1] for r in rows]),
                             metrics[step]["response_length_mean"], places=5)
    for r in self.rows:
      prompt, completion = r["messages"][0]["content"], r["messages"][1]["content"]
      self.assertEqual([m["role"] for m in r["messages"]], ["user", "assistant"])
      n_prompt, n = r["turn_tokens"]
      self.assertLen(r["tokens"], n_prompt + n)
      self.assertLen(r["loss_mask"], n_prompt + n)
      self.assertLen(r["behaviour_logprobs"], n_prompt + n)
      self.assertEqual(r["loss_mask"], [0] * n_prompt + [1] * n)
      lp = np.asarray(r["behaviour_logprobs"])
      self.assertTrue(np.all(lp[:n_prompt] == 0) and np.all(lp[n_prompt:] <= 0), lp)
      self.assertTrue(np.any(lp[n_prompt:] < 0))
      # The reward is the reward function's value of the logged completion.
      self.assertEqual(r["reward"], float(sum("a" <= ch <= "z" for ch in completion)))
      self.assertEqual(r["reward_parts"], {"count_lowercase": r["reward"]})
      self.assertIn(r["ended"], ("eos", "max_new_tokens"))
      self.assertTrue(prompt)

  def test_a_resumed_run_logs_each_step_once(self):
    second = self.create_tempdir().full_path
    shutil.copytree(os.path.join(self.workdir, "checkpoints", "2"),
                    os.path.join(second, "checkpoints", "2"))
    # What an interrupted run left: the rows of every step, those after the checkpoint too.
    shutil.copy(os.path.join(self.workdir, rollout_log.FILE), second)
    training.train(config(), second, devices=jax.devices()[:2])
    rows = read_rollouts(second)
    self.assertEqual([r["step"] for r in rows], [2] * 32 + [4] * 32)
    self.assertEqual(rows, self.rows)  # resume is exact: step 4's completions too

  def test_a_negative_interval_is_refused(self):
    bad = config()
    bad.logging.rollouts_every = -1
    with self.assertRaisesRegex(config_lib.ConfigError, r"logging.rollouts_every=-1: expected"):
      config_lib.validate(bad)


if __name__ == "__main__":
  absltest.main()
