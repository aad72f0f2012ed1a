"""The demo's pieces: the shipped warm start, a few GRPO steps of its config, the plot."""
import json
import os

import numpy as np
from absl.testing import absltest

from configs import grpo_arithmetic, grpo_arithmetic_moe
from jaxrl_llm import assets, models, plots, sampling, training
from jaxrl_llm.data import load_tokenizer


def greedy_accuracy(path: str) -> tuple[float, list[str], models.Model]:
  """The shipped model at `path`'s greedy exact-match rate on 48 fixed problems."""
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
  return float(np.mean(right)), answers, model


class ShippedCheckpointTest(absltest.TestCase):

  def test_warm_start_answers_some_problems(self):
    accuracy, answers, _ = greedy_accuracy(assets.path("arithmetic_sft"))
    # Some answers right (RL has signal), not all of them (RL has something to do).
    self.assertGreater(accuracy, 0.05, answers)
    self.assertLess(accuracy, 0.95, answers)

  def test_moe_warm_start_is_the_moe_demos_and_answers_some_problems(self):
    path = grpo_arithmetic_moe.get_config().model.path
    self.assertEqual(path, assets.path("arithmetic_moe_sft"))
    accuracy, answers, model = greedy_accuracy(path)
    self.assertEqual((model.config.num_experts, model.config.num_experts_per_tok), (8, 4))
    self.assertGreater(accuracy, 0.05, answers)
    self.assertLess(accuracy, 0.95, answers)

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
