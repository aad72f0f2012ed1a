"""The trainer's restructuring into plan / setup / feed / prepare / programs changed no
number: tiny runs of several presets log the metrics recorded by the code before it
(commit 19b98b1), bit for bit on the recording machine. (Two eval keys were renamed
since: `eval/reward/total` is `eval/reward_mean`, and `eval/accuracy`, a copy of the first
reward function's `eval/reward/NAME`, is gone.)"""
import importlib
import json
import os

import jax
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from jaxrl_llm import training
from tests.training.run_logs import TIMING, read_jsonl

RECORDED = os.path.join(os.path.dirname(__file__), "metrics_19b98b1.json")
# name -> (preset, overrides of its `runlocal` variant): a critic, minibatches, SFT, dynamic
# sampling, evaluation, bf16 (recomputed old log-probs).
CASES = {
    "ppo": ("ppo", {"train.steps": 3}),
    "gspo": ("gspo", {"train.steps": 3}),
    "sft": ("sft", {"train.steps": 3}),
    "dapo": ("dapo", {"train.steps": 3}),
    "grpo_eval": ("grpo", {"train.steps": 3, "train.eval_every": 2}),
    "grpo_bf16": ("grpo", {"train.steps": 2, "model.dtype": "bfloat16"}),
}


@pytest.mark.slow
class UnchangedMetricsTest(parameterized.TestCase):

  @parameterized.parameters(*CASES)
  def test_metrics_as_recorded(self, name):
    preset, overrides = CASES[name]
    config = importlib.import_module(f"configs.{preset}").get_config("runlocal")
    config.train.peak_flops_per_device = 1e9
    for path, value in overrides.items():
      group, field = path.split(".")
      config[group][field] = value
    workdir = self.create_tempdir().full_path
    training.train(config, workdir, devices=jax.devices()[:2])
    with open(RECORDED) as f:
      recorded = json.load(f)[name]
    rows = [{k: v for k, v in r.items() if k not in TIMING} for r in read_jsonl(workdir)]
    self.assertLen(rows, len(recorded))
    for got, want in zip(rows, recorded):
      self.assertEqual(sorted(got), sorted(want))
      for k in want:  # another CPU's XLA may round differently: 1e-5
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}")


if __name__ == "__main__":
  absltest.main()
