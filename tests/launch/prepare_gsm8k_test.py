"""`python -m launch.prepare_gsm8k`: GSM8K from its official JSONL files or from a local
TFDS `gsm8k` dataset, written as the {"prompt", "answer"} records the trainer reads.

The TFDS dataset is built here, in array_record format, by TFDS's own `gsm8k` builder with
only its download replaced by local files (nothing downloads).
"""
import json
import os
import subprocess
import sys
import tempfile

import ml_collections
from absl.testing import absltest
from tensorflow_datasets.text.gsm8k import gsm8k as tfds_gsm8k

from jaxrl_llm import data
from jaxrl_llm.rewards import gsm8k

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBLEMS = {  # GSM8K's own layout: a worked solution ending in '#### N'
    "train": [{"question": "Ann has 3 apples and buys 4 more. How many apples does she have?",
               "answer": "She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
              {"question": "A box holds 1,200 pens. How many pens are in 2 boxes?",
               "answer": "2 boxes hold 2 * 1200 = <<2*1200=2400>>2400 pens.\n#### 2,400"}],
    "test": [{"question": "Tom had 10 cards and gave away 4. How many are left?",
              "answer": "10 - 4 = <<10-4=6>>6 cards are left.\n#### 6"}],
}


class Gsm8k(tfds_gsm8k.Gsm8k, skip_registration=True):
  """TFDS's gsm8k builder (same name, features, examples), reading local files."""

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    return {split: self._generate_examples(os.path.join(self.local_dir, f"{split}.jsonl"))
            for split in PROBLEMS}


def write_official_jsonl(directory):
  for split, rows in PROBLEMS.items():
    with open(os.path.join(directory, f"{split}.jsonl"), "w") as f:
      f.writelines(json.dumps(row) + "\n" for row in rows)
  return directory


def prepare(*flags):
  run = subprocess.run([sys.executable, "-m", "launch.prepare_gsm8k", *flags], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr
  return run


class PrepareGsm8kTest(absltest.TestCase):

  def assert_prepared(self, output_dir):
    data_cfg = ml_collections.ConfigDict({"source": f"jsonl:{output_dir}/{{split}}.jsonl",
                                          "tfds_data_dir": ""})
    for split, gsm8k_split in (("train", "train"), ("eval", "test")):
      records = data.load_dataset(data_cfg, split)  # what the trainer reads
      self.assertEqual([r["prompt"] for r in records], [
          f"{p['question']}\n\nLet's think step by step and output the final answer after "
          '"####".' for p in PROBLEMS[gsm8k_split]])
      answers = [r["answer"] for r in records]
      self.assertEqual(answers, [p["answer"] for p in PROBLEMS[gsm8k_split]])
      final = [a.rpartition("#### ")[2] for a in answers]  # the reward scores against these
      self.assertEqual(gsm8k.gsm8k_exact([""] * len(final), [f"#### {f}" for f in final], answers),
                       [1.0] * len(final))

  def test_from_official_jsonl(self):
    source = write_official_jsonl(self.create_tempdir().full_path)
    output = os.path.join(self.create_tempdir().full_path, "gsm8k")
    run = prepare(f"--gsm8k_jsonl_dir={source}", f"--output_dir={output}")
    self.assertIn("train.jsonl: 2 problems (GSM8K train)", run.stdout)
    self.assert_prepared(output)

  def test_from_local_tfds(self):
    data_dir = self.create_tempdir().full_path
    builder = Gsm8k(data_dir=data_dir, file_format="array_record")
    builder.local_dir = write_official_jsonl(self.create_tempdir().full_path)
    saved, tempfile.tempdir = tempfile.tempdir, data_dir  # TFDS leaves a scratch dir there
    try:
      builder.download_and_prepare()
    finally:
      tempfile.tempdir = saved
    self.assertEqual(builder.info.full_name, "gsm8k/1.0.0")
    self.assertEqual(set(builder.info.features), {"question", "answer", "annotation",
                                                  "short_answer"})
    output = os.path.join(self.create_tempdir().full_path, "gsm8k")
    prepare(f"--tfds_data_dir={data_dir}", f"--output_dir={output}")
    self.assert_prepared(output)

  def test_needs_one_source(self):
    run = subprocess.run([sys.executable, "-m", "launch.prepare_gsm8k"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    self.assertNotEqual(run.returncode, 0)
    self.assertIn("expected exactly one of --tfds_data_dir and --gsm8k_jsonl_dir", run.stderr)


if __name__ == "__main__":
  absltest.main()
