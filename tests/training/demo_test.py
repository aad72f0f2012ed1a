"""The demo's pieces: the shipped warm start, a few GRPO steps of its config, the plot."""
import json
import os

import numpy as np
from absl.testing import absltest

from configs import grpo_arithmetic
from jaxrl_llm import assets, models, plots, sampling, training
from jaxrl_llm.data import load_tokenizer


class ShippedCheckpointTest(absltest.TestCase):

  def test_warm_start_answers_some_problems(self):
    path = assets.path("arithmetic_sft")
    model, tokenizer = models.from_pretrained(path), load_tokenizer(path)
    problems = [(a, b, op) for a in (3, 11, 25, 7, 19, 30) for b in (4, 9, 16, 28) for op in "+-"]
    prompts = [tokenizer.encode(f"{a}{op}{b}=", add_special_tokens=False) for a, b, op in problems]
    out = sampling.generate(model, prompts, num_samples=1, max_new_tokens=4, temperature=0.0,
                            eos_ids=(tokenizer.eos_token_id,), pad_id=tokenizer.pad_token_id)
    answers = tokenizer.batch_decode([row[:n].tolist() for row, n in
                                      zip(np.asarray(out.tokens), np.asarray(out.lengths))],
                                     skip_special_tokens=True)
    right = [ans.strip() == str(a + b if op == "+" else a - b)
             for ans, (a, b, op) in zip(answers, problems)]
    # Some answers right (RL has signal), not all of them (RL has something to do).
    self.assertGreater(np.mean(right), 0.05, answers)
    self.assertLess(np.mean(right), 0.95, answers)

  def test_missing_asset(self):
    with self.assertRaisesRegex(FileNotFoundError, "no shipped asset 'nope'"):
      assets.path("nope")


class DemoConfigTest(absltest.TestCase):

  def test_a_few_steps_and_the_plot(self):
    config = grpo_arithmetic.get_config("runlocal")
    config.train.steps = 3
    config.train.eval_every = 3
    workdir = self.create_tempdir().full_path
    training.train(config, workdir)
    rows = plots.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    self.assertEqual([r["step"] for r in rows], [0, 1, 2, 3])
    accuracy = "eval/reward/arithmetic_exact"
    self.assertIn(accuracy, rows[0])
    self.assertIn(accuracy, rows[-1])
    self.assertGreater(rows[0][accuracy], 0.0)  # the warm start gets some right
    png = os.path.join(workdir, "curves.png")
    plots.plot_curves(os.path.join(workdir, "metrics.jsonl"), png, ("reward_mean", accuracy))
    with open(png, "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    with open(os.path.join(workdir, "export", "config.json")) as f:
      self.assertEqual(json.load(f)["model_type"], "llama")


if __name__ == "__main__":
  absltest.main()
