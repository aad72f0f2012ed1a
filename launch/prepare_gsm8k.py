r"""Writes GSM8K as the JSONL prompts configs/qwen3_gsm8k.py trains on: {"prompt", "answer"}.

From a local TFDS data directory holding the `gsm8k` dataset (prepared in array_record
format, which reads without TensorFlow), or from the official JSONL files
(github.com/openai/grade-school-math, grade_school_math/data/{train,test}.jsonl):

  python -m launch.prepare_gsm8k --tfds_data_dir=$HOME/tensorflow_datasets --output_dir=gsm8k
  python -m launch.prepare_gsm8k --gsm8k_jsonl_dir=grade-school-math/grade_school_math/data \
      --output_dir=gsm8k

It writes OUTPUT_DIR/train.jsonl (GSM8K's train split, 7,473 problems) and
OUTPUT_DIR/eval.jsonl (its test split, 1,319), read by `--config.data.source=
'jsonl:OUTPUT_DIR/{split}.jsonl'`. A prompt is the question, a blank line and
`--instruction`; `answer` is GSM8K's whole solution, whose `#### N` line the reward
(`jaxrl_llm.rewards.gsm8k`) reads. Nothing downloads here: the TFDS dataset must be
prepared already, e.g. on a machine that may download,
`tfds.builder("gsm8k", data_dir=DIR, file_format="array_record").download_and_prepare()`.
"""
import json
import os

from absl import app, flags

# verl's GSM8K prompt (examples/data_preprocess/gsm8k.py); the reward also reads \boxed{}.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = {"train": "train", "eval": "test"}  # our split -> GSM8K's

_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", "", "TFDS data directory holding gsm8k.")
_TFDS_NAME = flags.DEFINE_string("tfds_name", "gsm8k", "The TFDS dataset's name.")
_JSONL_DIR = flags.DEFINE_string("gsm8k_jsonl_dir", "", "Directory of GSM8K's train.jsonl and "
                                 "test.jsonl (fields question, answer).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "gsm8k", "Where train.jsonl and eval.jsonl go.")
_INSTRUCTION = flags.DEFINE_string("instruction", INSTRUCTION, "Text after each question.")


def to_record(question: str, answer: str, instruction: str) -> dict[str, str]:
  return {"prompt": f"{question.strip()}\n\n{instruction}" if instruction else question.strip(),
          "answer": answer}


def read_tfds(name: str, data_dir: str, split: str) -> list[tuple[str, str]]:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  source = tfds.data_source(name, data_dir=data_dir, split=split)
  decode = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
  return [(decode(r["question"]), decode(r["answer"])) for r in source]


def read_jsonl(path: str) -> list[tuple[str, str]]:
  with open(path, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  for i, row in enumerate(rows):
    if not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
      raise ValueError(f"{path}: record {i} has no string 'question' and 'answer' fields "
                       f"(fields: {sorted(row)}); expected GSM8K's JSONL")
  return [(row["question"], row["answer"]) for row in rows]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if bool(_TFDS_DATA_DIR.value) == bool(_JSONL_DIR.value):
    raise app.UsageError("expected exactly one of --tfds_data_dir and --gsm8k_jsonl_dir")
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  for split, gsm8k_split in SPLITS.items():
    if _TFDS_DATA_DIR.value:
      pairs = read_tfds(_TFDS_NAME.value, _TFDS_DATA_DIR.value, gsm8k_split)
    else:
      pairs = read_jsonl(os.path.join(_JSONL_DIR.value, f"{gsm8k_split}.jsonl"))
    path = os.path.join(_OUTPUT_DIR.value, f"{split}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(to_record(q, a, _INSTRUCTION.value)) + "\n" for q, a in pairs)
    print(f"{path}: {len(pairs)} problems (GSM8K {gsm8k_split})")


if __name__ == "__main__":
  app.run(main)
