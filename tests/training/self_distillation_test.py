"""On-policy self-distillation (opsd): the teacher is the policy reading a hint block first.

The hint is rendered as the chat template's system message (plain text without one),
its tokens sit before the unchanged prompt, and the teacher's log-probs of each sampled
completion are exactly the policy's own after the hint, the hint sliced off."""
import json
import os

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import config as config_lib
from jaxrl_llm import data, models, training
from jaxrl_llm.config import ConfigError
from jaxrl_llm.data import char_tokenizer
from jaxrl_llm.training import plan as plan_lib
from jaxrl_llm.training import prepare, rollouts
from jaxrl_llm.training import setup as setup_lib

G, N = 2, 4


def opsd_config(data_source="jsonl:/nonexistent/{split}.jsonl"):
  config = config_lib.preset("opsd:runlocal")
  config.data.source = data_source
  config.sampling.num_samples = G
  config.sampling.max_new_tokens = N
  config.train.prompts_per_step = 4  # 8 rows: one per CPU device
  config.algo.distill.max_hint_len = 24
  config.algo.distill.hint_template = "ex {demonstration};"
  return config


class HintTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tokenizer = data.run_tokenizer(config_lib.base_config().model)  # characters

  def test_plain_text_without_a_template_left_padded(self):
    hints = [data.Hint("demo", "ex {demonstration};"), None]
    records = [{"prompt": "1+2=", "demo": "3+4=7"}, {"prompt": "5+5="}]
    ids = [self.tokenizer.encode(r["prompt"], add_special_tokens=False) for r in records]
    tokens, mask = data.hinted_prompts(self.tokenizer, records, ids, hints, 8, 16, 0)
    self.assertEqual(tokens.shape, (2, 24))
    text = self.tokenizer.decode(tokens[0][mask[0] > 0])
    self.assertEqual(text, "ex 3+4=7;1+2=")
    self.assertEqual(self.tokenizer.decode(tokens[1][mask[1] > 0]), "5+5=")
    self.assertEqual(mask.sum(1).tolist(), [13, 4])
    self.assertEqual(mask[0, -13:].tolist(), [1] * 13)  # left-padded

  def test_a_chat_template_renders_a_system_message(self):
    self.tokenizer.chat_template = char_tokenizer.SIMPLE_CHAT_TEMPLATE
    block = data.hints.render_hint(self.tokenizer, "see {demonstration}", "7")
    self.assertEqual(self.tokenizer.decode(block), "S:see 7 ")

  def test_missing_and_long_hints_are_named(self):
    hint = [data.Hint("demo", "{demonstration}")]
    with self.assertRaisesRegex(ValueError, r"record 5 has no text in field 'demo'"):
      data.hinted_prompts(self.tokenizer, [{"prompt": "x"}], [[5]], hint, 4, 8, 0, indices=[5])
    with self.assertRaisesRegex(ValueError, r"hint is 9 tokens, more than "
                                "algo.distill.max_hint_len=8"):
      data.hinted_prompts(self.tokenizer, [{"prompt": "x", "demo": "123456789"}], [[5]], hint,
                          4, 8, 0)


class SelfTeacherTest(absltest.TestCase):

  def test_teacher_logp_is_the_policy_after_the_hint(self):
    config = opsd_config()
    plan = plan_lib.make_plan(config)
    self.assertTrue(plan.self_teacher)
    self.assertFalse(plan.teacher)
    tokenizer = data.run_tokenizer(config.model)
    policy = models.init(setup_lib.model_config(config.model), jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    records = [{"prompt": "12+7=", "demonstration": "3+4=7"},
               {"prompt": "1-1=", "demonstration": "10-2=8"}]
    tok = data.tokenize_prompts(tokenizer, [r["prompt"] for r in records], config.data, (8,))
    hint_tokens, hint_mask = data.hinted_prompts(
        tokenizer, records, tok.token_lists,
        [data.Hint("demonstration", config.algo.distill.hint_template)] * 2, 8, 24, 0)
    completions = rng.integers(4, 60, size=(2 * G, N)).astype(np.int32)
    lengths = np.array([4, 2, 3, 1])
    cmask = (np.arange(N)[None] < lengths[:, None]).astype(np.int32)
    rep = lambda a: np.repeat(a, G, axis=0)
    batch = rollouts.TrainBatch(
        tokens=np.concatenate([rep(tok.tokens), completions], 1),
        attention_mask=np.concatenate([rep(tok.mask), cmask], 1), loss_mask=cmask,
        rewards=np.zeros(2 * G, np.float32), sampler_logp=np.zeros((2 * G, N), np.float32),
        hint_tokens=np.concatenate([rep(hint_tokens), completions], 1),
        hint_attention_mask=np.concatenate([rep(hint_mask), cmask], 1))
    out, metrics, _ = jax.jit(lambda b, p: prepare.prepare_batch(
        b, p, None, None, None, None, plan=plan, num_samples=G, temperature=1.0, chunk_size=4,
        num_micro=2))(jax.tree.map(jnp.asarray, batch), policy)
    self.assertIsNone(out.hint_tokens)
    self.assertIn("distill/reverse_kl", metrics)
    # By hand: one unpadded forward over hint + prompt + completion per row.
    for b in range(2 * G):
      record = records[b // G]
      hint = tokenizer.encode(f"ex {record['demonstration']};", add_special_tokens=False)
      ids = hint + tok.token_lists[b // G] + completions[b, :lengths[b]].tolist()
      L = len(ids)
      logits, _ = models.forward(policy, jnp.asarray([ids]), jnp.arange(L)[None],
                                 jnp.ones((1, L), jnp.int32))
      logp = jax.nn.log_softmax(logits[0], -1)
      start = L - lengths[b]
      expected = [float(logp[start - 1 + t, ids[start + t]]) for t in range(lengths[b])]
      np.testing.assert_allclose(np.asarray(out.teacher_logp[b, :lengths[b]]), expected,
                                 rtol=1e-4, atol=1e-4)
      self.assertTrue(np.all(np.asarray(out.teacher_logp[b, lengths[b]:]) == 0))


class SelfDistillationRunTest(absltest.TestCase):

  def write_data(self, with_demo=True):
    folder = self.create_tempdir().full_path
    for split in ("train", "eval"):
      with open(os.path.join(folder, f"{split}.jsonl"), "w") as f:
        for a in range(12):
          record = {"prompt": f"{a}+{a}=", "answer": 2 * a}
          if with_demo:
            record["demonstration"] = f"{a}+{a}={2 * a}"
          f.write(json.dumps(record) + "\n")
    return f"jsonl:{folder}/{{split}}.jsonl"

  def test_runs_and_logs_the_gap(self):
    config = opsd_config(self.write_data())
    config.rewards.functions = ("jaxrl_llm.rewards.arithmetic:arithmetic_exact",)
    config.rewards.weights = (1.0,)
    workdir = self.create_tempdir().full_path
    training.train(config, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    self.assertLen(rows, 2)
    for row in rows:
      self.assertGreater(row["distill/reverse_kl"], -1.0)
      self.assertIn("distill_loss", row)

  def test_records_without_the_demonstration_stop_at_start(self):
    config = opsd_config(self.write_data(with_demo=False))
    with self.assertRaisesRegex(ConfigError, r"config.data.source=.*record 0 has no text in "
                                "field 'demonstration'"):
      config_lib.validate(config, data=True)


if __name__ == "__main__":
  absltest.main()
