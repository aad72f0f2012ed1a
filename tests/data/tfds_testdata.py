"""A tiny TFDS dataset, built locally by the data tests (never downloaded).

TFDS needs a builder to live in an importable package module, not a test
script, so it sits here. `build(data_dir)` prepares it in `array_record` format.
"""
import tempfile

import numpy as np
import tensorflow_datasets as tfds

NAME = "jaxrl_llm_tiny_prompts"
NUM_TRAIN, NUM_TEST = 12, 3


def example(i: int) -> dict:
  """Record `i` as the builder writes it (and as the loader should return it)."""
  return {"prompt": f"{i}+{i}=", "answer": f"#### {2 * i}", "value": i,
          "numbers": list(range(i % 4)), "note": "naïve ✓"}


class JaxrlLlmTinyPrompts(tfds.core.GeneratorBasedBuilder):
  """Prompts `i+i=` with a GSM8K-style answer and a few other feature types."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        "prompt": tfds.features.Text(),
        "answer": tfds.features.Text(),
        "value": np.int32,
        "numbers": tfds.features.Sequence(np.int32),
        "note": tfds.features.Text(),
    }))

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    return {"train": self._generate_examples(0, NUM_TRAIN),
            "test": self._generate_examples(100, 100 + NUM_TEST)}

  def _generate_examples(self, start, stop):
    for i in range(start, stop):
      yield i, example(i)


class JaxrlLlmNoPrompt(tfds.core.GeneratorBasedBuilder):
  """A dataset without a `prompt` feature, for the error test."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({"question": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    yield 0, {"question": "1+1="}


def build(data_dir: str) -> None:
  """Prepares both datasets under `data_dir`."""
  # TFDS makes (and leaves) an empty scratch directory per builder; keep it in data_dir.
  saved, tempfile.tempdir = tempfile.tempdir, data_dir
  try:
    for builder_cls in (JaxrlLlmTinyPrompts, JaxrlLlmNoPrompt):
      builder_cls(data_dir=data_dir, file_format="array_record").download_and_prepare()
  finally:
    tempfile.tempdir = saved
