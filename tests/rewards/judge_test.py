"""Reward models and LLM judges (`config.judge`): a classifier's scores equal transformers'
`AutoModelForSequenceClassification`; a generative judge's verdicts are its greedy answers,
parsed; both train a GRPO run through the command line; bad input exits before loading."""
import json
import os
import tempfile
from unittest import mock

import jax
import numpy as np
import pytest
import torch
import transformers
from absl.testing import absltest

from configs import smoke
from jaxrl_llm import training
from jaxrl_llm.config import ConfigError, schema, validate
from jaxrl_llm.config import reward_checks
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.data import char_tokenizer
from jaxrl_llm.rewards import RewardError
from jaxrl_llm.training import setup as setup_lib
from tests import cli_runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 128
SHAPE = dict(vocab_size=VOCAB, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
             rms_norm_eps=1e-6, bos_token_id=char_tokenizer.BOS_ID,
             eos_token_id=char_tokenizer.EOS_ID, pad_token_id=char_tokenizer.PAD_ID,
             tie_word_embeddings=False)
TEXTS = [("What is 2+3? ", "5"), ("Name a colour: ", "blue, or maybe a long green"),
         ("x", ""), ("Count: ", "one two three four five six seven eight nine ten " * 3)]


def classifier_dir(path: str) -> str:
  """A random Llama reward model (one label) over the character tokenizer."""
  torch.manual_seed(0)
  model = transformers.LlamaForSequenceClassification(
      transformers.LlamaConfig(**SHAPE, num_labels=1)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(path)
  char_tokenizer.build_char_tokenizer(path, vocab_size=VOCAB)
  return path


def seven_dir(path: str) -> str:
  """A random Llama whose greedy answer is '7' at every step: every embedding shares a
  constant direction, which the unembedding row of '7' reads strongly."""
  torch.manual_seed(1)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE)).eval()
  tokenizer = char_tokenizer.build_char_tokenizer(path, vocab_size=VOCAB)
  seven = tokenizer.convert_tokens_to_ids("7")
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
    model.model.embed_tokens.weight[:, 0] = 1.0
    model.lm_head.weight[seven, 0] = 50.0
  model.save_pretrained(path)
  return path


def judge_config(path: str, kind: str):
  config = smoke.get_config()
  config.judge.path, config.judge.kind, config.judge.chat = path, kind, False
  config.judge.batch_size = 4
  return config


class JudgeTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp()
    cls.classifier = classifier_dir(os.path.join(cls.tmp, "classifier"))
    cls.seven = seven_dir(os.path.join(cls.tmp, "seven"))

  def test_classifier_scores_equal_transformers(self):
    config = judge_config(self.classifier, "classifier")
    judge = setup_lib.load_judge(config)
    prompts, completions = [p for p, _ in TEXTS] * 2, [c for _, c in TEXTS] * 2  # 2 programs
    # The sources' reward set scores with the judge in the place of the placeholder they name.
    reward_set = reward_checks.reward_set(sources_lib.run_sources(config)[0], judge)
    got = reward_set(prompts, completions, answer=["0"] * len(prompts)).per_function["judge"]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(self.classifier).eval()
    for p, c, score in zip(prompts, completions, got):
      ids = judge.conversation(p, c)
      self.assertEqual(ids, judge.tokenizer(p + c)["input_ids"])
      with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, 0].item()
      np.testing.assert_allclose(score, want, rtol=1e-4, atol=1e-4)
    self.assertGreater(judge.flops, 0)
    # Two judges in one process share nothing: another one's FLOPs start at 0 and this one's
    # own count does not move while the other scores.
    other, spent = setup_lib.load_judge(config), judge.flops
    self.assertEqual(other.flops, 0.0)
    np.testing.assert_array_equal(other.reward(prompts, completions), got)
    self.assertEqual(judge.flops, spent)
    self.assertGreater(other.flops, 0)
    with self.assertRaisesRegex(RewardError, "judge:judge.*this reward set has no judge"):
      reward_checks.reward_set(sources_lib.run_sources(config)[0])(
          prompts, completions, answer=["0"] * len(prompts))

  def test_generative_verdicts_are_its_greedy_answers_parsed(self):
    config = judge_config(self.seven, "generative")
    config.judge.template = "Q: {prompt} A: {completion} ({answer}) Score:"
    config.judge.parser, config.judge.max_new_tokens = r"(\d)", 4
    judge = setup_lib.load_judge(config)
    prompts, completions = [p for p, _ in TEXTS], [c for _, c in TEXTS]
    asks = [judge.question(p, c, {"answer": "a"}) for p, c in zip(prompts, completions)]
    self.assertEqual(judge.tokenizer.decode(asks[0]), "Q: What is 2+3?  A: 5 (a) Score:")
    model = transformers.AutoModelForCausalLM.from_pretrained(self.seven).eval()
    for ask, verdict in zip(asks, judge.generate(asks)):
      with torch.no_grad():
        out = model.generate(torch.tensor([ask]), max_new_tokens=4, do_sample=False)
      self.assertEqual(verdict, judge.tokenizer.decode(out[0, len(ask):]))
      self.assertEqual(verdict, "7777")
    scores = judge.reward(prompts, completions, answer=["a"] * 4)
    np.testing.assert_array_equal(scores, [7.0] * 4)
    config.judge.parser, config.judge.unparsed = r"Score: (\d+)", -1.0  # never in "7777"
    np.testing.assert_array_equal(setup_lib.load_judge(config)(prompts, completions, {"answer": ["a"] * 4}),
                                  [-1.0] * 4)

  def test_bad_judges_are_refused_before_loading(self):
    config = judge_config(os.path.join(self.tmp, "missing"), "classifier")
    self.assertRaisesRegex(ConfigError, r"config.judge.path=.*missing", validate, config)
    config = judge_config(self.seven, "classifier")  # a causal LM: no score head
    self.assertRaisesRegex(ConfigError, r"has no score head \(score.weight\)", validate, config)
    config = judge_config(self.seven, "generative")
    config.judge.template = "Rate {prompt}"
    self.assertRaisesRegex(ConfigError, r"config.judge.template=.*expected a template with "
                           r"\{completion\}", validate, config)
    with mock.patch.object(jax, "process_count", return_value=2):
      self.assertRaisesRegex(ConfigError, r"config.judge.kind='generative' on 2 processes",
                             validate, judge_config(self.seven, "generative"))
    config = judge_config(self.classifier, "classifier")
    config.judge.sources = ("math",)
    self.assertRaisesRegex(ConfigError, r"config.judge.sources=.*'math' is not a source", validate,
                           config)

  def test_the_judge_scores_the_sources_it_names(self):
    config = judge_config(self.classifier, "classifier")
    config.judge.weight = 0.25
    with config.sources.unlocked():
      config.sources.a = schema.source_config("task:arithmetic")
      config.sources.b = schema.source_config("task:arithmetic")
    config.judge.sources = ("b",)
    functions = {s.name: (tuple(s.rewards.functions), tuple(s.rewards.weights))
                 for s in sources_lib.run_sources(config)}
    plain = tuple(schema.rewards_config().functions)
    self.assertEqual(functions["a"][0], plain)
    self.assertEqual(functions["b"], (plain + (sources_lib.JUDGE_FUNCTION,),
                                      tuple(schema.rewards_config().weights) + (0.25,)))
    config.judge.sources = ()  # every source
    self.assertTrue(all(s.rewards.functions[-1] == sources_lib.JUDGE_FUNCTION
                        for s in sources_lib.run_sources(config)))

  @pytest.mark.slow("a real `python -m launch.train` (one step of the smoke run with a classifier "
                    "judge, forked from tests/cli_runs.py's server: it compiles the run's programs), "
                    "then the generative judge's run in this process")
  def test_judges_train_grpo_through_the_command_line(self):
    """The classifier through the command line (its `--config.judge.*` flags); the generative
    judge, the same run but for its kind and path, in this process (the command line is the
    same path)."""
    for kind, path in (("classifier", self.classifier), ("generative", self.seven)):
      workdir = os.path.join(self.tmp, f"run_{kind}")
      if kind == "classifier":
        proc = cli_runs.run(
            "launch.train",
            ["--config=configs/smoke.py", f"--workdir={workdir}", f"--config.judge.path={path}",
             f"--config.judge.kind={kind}", "--config.judge.chat=False",
             "--config.judge.weight=0.5", "--config.train.steps=1",
             "--config.logging.rollouts_every=1", r"--config.judge.parser=(\d)",
             "--config.judge.max_new_tokens=2"],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
      else:
        config = smoke.get_config()
        config.judge.path, config.judge.kind, config.judge.chat = path, kind, False
        config.judge.weight, config.train.steps, config.logging.rollouts_every = 0.5, 1, 1
        config.judge.parser, config.judge.max_new_tokens = r"(\d)", 2
        training.train(config, workdir)
      with open(os.path.join(workdir, "metrics.jsonl")) as f:
        row = [json.loads(line) for line in f][-1]
      with open(os.path.join(workdir, "rollouts.jsonl")) as f:
        parts = [json.loads(line)["reward_parts"]["judge"] for line in f]
      self.assertIn("reward/judge", row)
      self.assertGreater(row["judge/flops"], 0)
      np.testing.assert_allclose(row["reward/judge"], np.mean(parts), rtol=1e-5)
      if kind == "generative":  # every verdict is '77'
        self.assertEqual(set(parts), {7.0})

  def test_a_bad_judge_exits_2_with_one_line(self):
    proc = cli_runs.run(
        "launch.train",
        ["--config=configs/smoke.py", f"--workdir={os.path.join(self.tmp, 'refused')}",
         f"--config.judge.path={self.seven}", "--config.judge.kind=classifier"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
    self.assertIn("has no score head", proc.stderr.strip().splitlines()[-1])


if __name__ == "__main__":
  absltest.main()
