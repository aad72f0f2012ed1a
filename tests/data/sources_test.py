"""Data sources: task:, jsonl: (and its errors), tfds: against a locally built dataset."""
import json
import os
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from jaxrl_llm import data
from jaxrl_llm import tasks


def data_cfg(source, tfds_data_dir=""):
  return ml_collections.ConfigDict({
      "source": source, "max_prompt_len": 32, "prompt_overflow": "error",
      "chat_template": False, "tfds_data_dir": tfds_data_dir, "shuffle_seed": 0})


class SourceTest(parameterized.TestCase):

  @parameterized.parameters("", "task", "task:", "csv:x.csv", "arithmetic")
  def test_malformed_source(self, source):
    with self.assertRaisesRegex(ValueError, "must be 'task:NAME'"):
      data.load_dataset(data_cfg(source), "train")

  def test_parse_source(self):
    self.assertEqual(data.parse_source("tfds:gsm8k/main:train"), ("tfds", "gsm8k/main:train"))
    self.assertEqual(data.parse_source("jsonl:/a/b:c.jsonl"), ("jsonl", "/a/b:c.jsonl"))


class TaskSourceTest(absltest.TestCase):

  def test_task_splits(self):
    options = dict(num_train=300, num_eval=20, max_value=9)
    train = data.load_dataset(data_cfg("task:arithmetic"), "train", task_options=options)
    ev = data.load_dataset(data_cfg("task:arithmetic"), "eval", task_options=options)
    self.assertLen(train, 300)
    self.assertLen(ev, 20)
    self.assertEqual(train[7], tasks.load_split("arithmetic", "train", **options)[7])
    self.assertEmpty({train[i]["prompt"] for i in range(300)} &
                     {ev[i]["prompt"] for i in range(20)})

  def test_unknown_task(self):
    with self.assertRaisesRegex(ValueError, "Unknown task 'nope'"):
      data.load_dataset(data_cfg("task:nope"), "train")


class JsonlSourceTest(parameterized.TestCase):

  def _write(self, text, name="data.jsonl"):
    path = os.path.join(self.create_tempdir().full_path, name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    return path

  def test_reads_records_with_their_fields(self):
    rows = [{"prompt": "2+2=", "answer": "#### 4", "numbers": [1, 2]},
            {"prompt": "Ünïcode?", "answer": 5}]
    path = self._write("\n".join(json.dumps(r) for r in rows) + "\n\n")
    dataset = data.load_dataset(data_cfg("jsonl:" + path), "train")
    self.assertLen(dataset, 2)
    self.assertEqual(dataset[0], rows[0])
    self.assertEqual(dataset[1], rows[1])

  def test_split_placeholder(self):
    directory = self.create_tempdir().full_path
    for split in ("train", "eval"):
      with open(os.path.join(directory, f"{split}.jsonl"), "w") as f:
        f.write(json.dumps({"prompt": split}) + "\n")
    cfg = data_cfg("jsonl:" + os.path.join(directory, "{split}.jsonl"))
    self.assertEqual(data.load_dataset(cfg, "train")[0]["prompt"], "train")
    self.assertEqual(data.load_dataset(cfg, "eval")[0]["prompt"], "eval")

  def test_missing_file(self):
    with self.assertRaisesRegex(FileNotFoundError, "no_such.jsonl"):
      data.load_dataset(data_cfg("jsonl:/tmp/no_such.jsonl"), "train")

  @parameterized.parameters(
      ('{"prompt": "a"}\n{"prompt": "b",}\n', r"data.jsonl:2: not valid JSON"),
      ('{"prompt": "a"}\n\n["prompt"]\n', r"data.jsonl:3: expected a JSON object"),
      ('{"prompt": "a"}\n{"question": "b"}\n', r"data.jsonl:2: .*no 'prompt' field.*question"),
      ('{"prompt": 7}\n', r"data.jsonl:1: 'prompt' is a int"),
      ("", "holds no records"),
      ("\n  \n", "holds no records"),
  )
  def test_bad_files(self, text, message):
    path = self._write(text)
    with self.assertRaisesRegex(ValueError, message):
      data.load_dataset(data_cfg("jsonl:" + path), "train")


class DemonstrationsTest(absltest.TestCase):

  def test_task_demonstrations(self):
    demos = data.load_demonstrations(data_cfg("task:arithmetic"), "eval",
                                     task_options=dict(num_eval=4))
    self.assertLen(demos, 4)
    self.assertEqual(demos[2]["completion"], str(demos[2]["answer"]))

  def test_jsonl_needs_a_completion_field(self):
    directory = self.create_tempdir().full_path
    good, bad = os.path.join(directory, "good.jsonl"), os.path.join(directory, "bad.jsonl")
    with open(good, "w") as f:
      f.write(json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n")
    with open(bad, "w") as f:
      f.write(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    self.assertEqual(data.load_demonstrations(data_cfg("jsonl:" + good), "train")[0],
                     {"prompt": "1+1=", "completion": "2"})
    with self.assertRaisesRegex(ValueError, "no string 'completion' field.*answer"):
      data.load_demonstrations(data_cfg("jsonl:" + bad), "train")


class TfdsSourceTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    from tests.data import tfds_testdata  # pylint: disable=g-import-not-at-top
    cls.testdata = tfds_testdata
    cls.data_dir = tempfile.mkdtemp()
    tfds_testdata.build(cls.data_dir)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.data_dir)
    super().tearDownClass()

  def _load(self, source, split="train", data_dir=None):
    return data.load_dataset(
        data_cfg(source, self.data_dir if data_dir is None else data_dir), split)

  def test_reads_decoded_records(self):
    dataset = self._load("tfds:" + self.testdata.NAME)
    self.assertLen(dataset, self.testdata.NUM_TRAIN)
    records = sorted((dataset[i] for i in range(len(dataset))), key=lambda r: r["value"])
    self.assertEqual(records, [self.testdata.example(i)
                               for i in range(self.testdata.NUM_TRAIN)])
    record = dataset[0]
    self.assertIsInstance(record["prompt"], str)
    self.assertIs(type(record["value"]), int)
    self.assertTrue(all(type(n) is int for n in records[3]["numbers"]))
    self.assertEqual(dataset[-1], dataset[len(dataset) - 1])
    with self.assertRaises(IndexError):
      dataset[len(dataset)]  # pylint: disable=pointless-statement

  def test_splits(self):
    name = self.testdata.NAME
    test = self._load(f"tfds:{name}:test")
    self.assertLen(test, self.testdata.NUM_TEST)
    self.assertLen(self._load(f"tfds:{name}:test", split="train"), self.testdata.NUM_TEST)
    self.assertLen(self._load(f"tfds:{name}", split="eval"), self.testdata.NUM_TEST)
    self.assertLen(self._load(f"tfds:{name}:train[:5]"), 5)
    with self.assertRaisesRegex(ValueError, "cannot read split 'validation'"):
      self._load(f"tfds:{name}:validation")

  def test_empty_split_names_the_dataset(self):
    with self.assertRaisesRegex(ValueError, f"{self.testdata.NAME}.*'train\\[:0\\]'"):
      self._load(f"tfds:{self.testdata.NAME}:train[:0]")

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, "tfds_data_dir"):
      self._load("tfds:" + self.testdata.NAME, data_dir="")
    with self.assertRaisesRegex(ValueError, "'not_prepared' is not prepared"):
      self._load("tfds:not_prepared")
    with self.assertRaisesRegex(ValueError, "no 'prompt' feature.*question"):
      self._load("tfds:jaxrl_llm_no_prompt")


if __name__ == "__main__":
  absltest.main()
