"""`training.greedy_samples`: held-out records, answered greedily, with their rewards."""
import jax
import numpy as np
from absl.testing import absltest, parameterized

from configs import grpo_arithmetic
from jaxrl_llm import data, models, sampling, training
from jaxrl_llm.rewards import arithmetic
from jaxrl_llm.training import setup


def greedy_answers(model_dir: str, prompts: list[str], max_new_tokens: int) -> list[str]:
  """The reference: the model's own greedy completions, unsharded, through `sampling.generate`."""
  model, tokenizer = models.from_pretrained(model_dir), data.load_tokenizer(model_dir)
  tokens = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
  out = sampling.generate(model, tokens, num_samples=1, max_new_tokens=max_new_tokens,
                          temperature=0.0, eos_ids=(tokenizer.eos_token_id,),
                          pad_id=tokenizer.pad_token_id)
  return tokenizer.batch_decode([row[:n].tolist() for row, n in
                                 zip(np.asarray(out.tokens), np.asarray(out.lengths))],
                                skip_special_tokens=True)


class GreedySamplesTest(parameterized.TestCase):

  @parameterized.named_parameters(("warm_start", False), ("model_path", True))
  def test_first_held_out_records(self, other_model):
    config = grpo_arithmetic.get_config("runlocal")
    model_dir = config.model.path
    if other_model:  # a random model of the same shape, as a run's export/ would be
      model_dir = self.create_tempdir().full_path
      random = models.init(setup.model_config(config.model), jax.random.PRNGKey(7))
      models.save_pretrained(random, model_dir)
      data.load_tokenizer(config.model.path).save_pretrained(model_dir)
    rows = training.greedy_samples(config, 8, model_path=model_dir if other_model else "")

    held_out = data.load_dataset(config.data, "eval", task_options=config.data.task_options)
    self.assertEqual([r["prompt"] for r in rows], [held_out[i]["prompt"] for i in range(8)])
    self.assertEqual([r["answer"] for r in rows], [held_out[i]["answer"] for i in range(8)])
    completions = [r["completion"] for r in rows]
    self.assertEqual(completions, greedy_answers(model_dir, [r["prompt"] for r in rows],
                                                 config.sampling.max_new_tokens))
    prompts, answers = [r["prompt"] for r in rows], [r["answer"] for r in rows]
    exact = arithmetic.arithmetic_exact(prompts, completions, answers)
    fmt = arithmetic.arithmetic_format(prompts, completions)
    np.testing.assert_array_equal([r["reward/arithmetic_exact"] for r in rows], exact)
    np.testing.assert_array_equal([r["reward/arithmetic_format"] for r in rows], fmt)
    np.testing.assert_allclose([r["reward"] for r in rows], np.add(exact, np.multiply(0.1, fmt)),
                               rtol=1e-6)
    if not other_model:  # the warm start gets some right and some wrong
      self.assertGreater(sum(exact), 0, completions)
      self.assertLess(sum(exact), 8, completions)

  @parameterized.parameters(0, 257)
  def test_count_out_of_range(self, count):
    config = grpo_arithmetic.get_config("runlocal")
    with self.assertRaisesRegex(ValueError, rf"count={count}: expected 1 to 256"):
      training.greedy_samples(config, count)

  def test_a_source_of_a_mixed_run(self):
    from configs import arithmetic  # pylint: disable=g-import-not-at-top
    config = arithmetic.get_config("preset=mixed,runlocal")
    config.sources.rl.task_options = dict(arithmetic.TASK_OPTIONS, seed=5)
    rows = training.greedy_samples(config, 3, source="rl")
    held_out = data.load_dataset(config.data, "eval", task_options=config.sources.rl.task_options)
    self.assertEqual([r["prompt"] for r in rows], [held_out[i]["prompt"] for i in range(3)])
    with self.assertRaisesRegex(ValueError, r"source='math': expected one of config.sources "
                                r"\['distill', 'rl'\]"):
      training.greedy_samples(config, 3, source="math")


if __name__ == "__main__":
  absltest.main()
