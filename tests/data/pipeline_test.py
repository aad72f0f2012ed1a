"""The pieces together, as the trainer uses them: source -> batches -> tokens -> rewards."""
import os
import shutil
import tempfile

from absl.testing import absltest
import ml_collections
import numpy as np

from jaxrl_llm import data
from jaxrl_llm import rewards
from jaxrl_llm import tasks
from jaxrl_llm.data import char_tokenizer


class PipelineTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root)
    char_tokenizer.build_char_tokenizer(os.path.join(root, "tok"), vocab_size=512)
    self.tokenizer = data.load_tokenizer(os.path.join(root, "tok"))

  def test_countdown_round_trip(self):
    cfg = ml_collections.ConfigDict({
        "source": "task:countdown", "max_prompt_len": 32, "prompt_overflow": "error",
        "chat_template": False, "tfds_data_dir": "", "shuffle_seed": 3})
    options = dict(num_train=64, num_eval=8)
    demos = data.load_demonstrations(cfg, "train", task_options=options)
    dataset = data.load_dataset(cfg, "train", task_options=options)
    batch = next(data.prompt_batches(dataset, 8, seed=cfg.shuffle_seed, start=5,
                                     process_index=1, process_count=2))
    self.assertLen(batch.records, 4)
    tok = data.tokenize_prompts(self.tokenizer, batch.prompts, cfg, (16, 32),
                                indices=batch.indices)
    self.assertEqual(tok.tokens.shape, (4, 32))
    decoded = self.tokenizer.batch_decode(tok.tokens, skip_special_tokens=True)
    self.assertEqual(decoded, batch.prompts)

    group = 2  # G completions per prompt: the right one, then a wrong one
    completions = [c for i in batch.indices for c in (demos[int(i)]["completion"], "1+")]
    task = tasks.TASKS["countdown"]
    reward_set = rewards.RewardSet(task.reward_functions, task.reward_weights)
    out = reward_set([p for p in batch.prompts for _ in range(group)], completions,
                     **batch.fields(repeat=group))
    np.testing.assert_allclose(out.total, [1.1, 0.0] * 4, rtol=1e-6)


if __name__ == "__main__":
  absltest.main()
