"""Prompt tokenisation with a locally built character tokenizer: template, special
tokens, overflow (error / truncate), bucket padding."""
import os
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections
import numpy as np

from jaxrl_llm import data
from jaxrl_llm.data import char_tokenizer
from jaxrl_llm.data import prompts as prompts_lib

BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}>{% endif %}")


def ids(text):
  """The character tokenizer's documented ids, computed independently."""
  return [4 + ord(c) - 32 for c in text]


def data_cfg(max_prompt_len=16, prompt_overflow="error", chat_template=False):
  return ml_collections.ConfigDict({
      "source": "task:arithmetic", "max_prompt_len": max_prompt_len,
      "prompt_overflow": prompt_overflow, "chat_template": chat_template,
      "tfds_data_dir": "", "shuffle_seed": 0})


class TokenizerTestCase(parameterized.TestCase):
  """Builds three tokenizers on disk and loads them back, as a run would."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    variants = {
        "plain": dict(vocab_size=512),
        "chat": dict(chat_template=char_tokenizer.SIMPLE_CHAT_TEMPLATE),
        "bos": dict(add_bos=True, chat_template=BOS_TEMPLATE),
    }
    cls.tok = {}
    for name, kwargs in variants.items():
      path = os.path.join(cls.root, name)
      char_tokenizer.build_char_tokenizer(path, **kwargs)
      cls.tok[name] = data.load_tokenizer(path)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root)
    super().tearDownClass()


class CharTokenizerTest(TokenizerTestCase):

  def test_ids_and_round_trip(self):
    tok = self.tok["plain"]
    text = "12+7*3= ~Hello"
    self.assertEqual(tok.encode(text, add_special_tokens=False), ids(text))
    self.assertEqual(tok.encode(text), ids(text))  # nothing added by default
    self.assertEqual(tok.decode(ids(text)), text)
    self.assertEqual(tok.decode(ids("33") + [char_tokenizer.EOS_ID, 0],
                                skip_special_tokens=True), "33")
    self.assertEqual(tok.encode("a\nb", add_special_tokens=False),
                     [69, char_tokenizer.UNK_ID, 70])
    self.assertEqual((tok.pad_token_id, tok.bos_token_id, tok.eos_token_id),
                     (char_tokenizer.PAD_ID, char_tokenizer.BOS_ID, char_tokenizer.EOS_ID))
    self.assertLen(tok, 512)
    self.assertLen(self.tok["chat"], 99)

  def test_bos_variant(self):
    self.assertEqual(self.tok["bos"].encode("ab"), [char_tokenizer.BOS_ID, 69, 70])
    self.assertTrue(prompts_lib.wants_bos(self.tok["bos"]))
    self.assertFalse(prompts_lib.wants_bos(self.tok["plain"]))

  def test_vocab_size_too_small(self):
    with self.assertRaisesRegex(ValueError, "vocab_size 50"):
      char_tokenizer.build_char_tokenizer(vocab_size=50)

  def test_missing_tokenizer_dir(self):
    with self.assertRaisesRegex(FileNotFoundError, "no_such_tokenizer"):
      data.load_tokenizer(os.path.join(self.root, "no_such_tokenizer"))


class EncodeTest(TokenizerTestCase):

  def test_plain(self):
    lists, truncated = data.encode_prompts(self.tok["plain"], ["12+7*3=", "5="],
                                           max_prompt_len=16)
    self.assertEqual(lists, [ids("12+7*3="), ids("5=")])
    self.assertEqual(truncated, 0)

  def test_tokenizer_bos_is_added_once(self):
    lists, _ = data.encode_prompts(self.tok["bos"], ["1+1="], max_prompt_len=16)
    self.assertEqual(lists, [[char_tokenizer.BOS_ID] + ids("1+1=")])

  def test_chat_template(self):
    lists, _ = data.encode_prompts(self.tok["chat"], ["1+1="], max_prompt_len=16,
                                   chat_template=True)
    self.assertEqual(lists, [ids("U:1+1= A:")])

  def test_chat_template_writes_its_own_bos(self):
    lists, _ = data.encode_prompts(self.tok["bos"], ["1+1="], max_prompt_len=16,
                                   chat_template=True)
    self.assertEqual(lists, [[char_tokenizer.BOS_ID] + ids("1+1=>")])

  def test_chat_template_missing(self):
    with self.assertRaisesRegex(ValueError, "has no chat template"):
      data.encode_prompts(self.tok["plain"], ["1+1="], max_prompt_len=16,
                          chat_template=True)

  def test_overflow_error_names_sample_length_and_limit(self):
    prompts = ["1+1=", "123456789+123456789="]
    with self.assertRaises(ValueError) as caught:
      data.encode_prompts(self.tok["plain"], prompts, max_prompt_len=8,
                          indices=[40, 41])
    message = str(caught.exception)
    for part in ("sample 1", "dataset index 41", "20 tokens", "max_prompt_len=8",
                 "prompt_overflow='truncate'"):
      self.assertIn(part, message)
    with self.assertRaisesRegex(ValueError, "sample 1 \\(batch index 1\\)"):
      data.encode_prompts(self.tok["plain"], prompts, max_prompt_len=8)

  def test_overflow_truncate_keeps_the_end(self):
    prompts = ["1+1=", "123456789+123456789=", "12345678"]
    lists, truncated = data.encode_prompts(self.tok["plain"], prompts, max_prompt_len=8,
                                           overflow="truncate")
    self.assertEqual(lists, [ids("1+1="), ids("3456789="), ids("12345678")])
    self.assertEqual(truncated, 1)

  def test_truncate_keeps_a_leading_bos(self):
    lists, truncated = data.encode_prompts(self.tok["bos"], ["abcdefghij"], max_prompt_len=4,
                                           overflow="truncate")
    self.assertEqual(lists, [[char_tokenizer.BOS_ID] + ids("hij")])
    self.assertEqual(truncated, 1)

  def test_bad_overflow_mode(self):
    with self.assertRaisesRegex(ValueError, "prompt_overflow must be one of"):
      data.encode_prompts(self.tok["plain"], ["a"], max_prompt_len=4, overflow="drop")


class PadTest(TokenizerTestCase):

  @parameterized.parameters((3, 4), (4, 4), (5, 8), (8, 8), (9, 16))
  def test_smallest_bucket_that_fits(self, longest, bucket):
    tokens, mask = data.pad_to_bucket([[7] * longest, [5, 6]], (16, 4, 8), pad_id=0)
    self.assertEqual(tokens.shape, (2, bucket))
    self.assertEqual(tokens.dtype, np.int32)
    self.assertEqual(mask.dtype, np.int32)
    np.testing.assert_array_equal(tokens[1], [0] * (bucket - 2) + [5, 6])  # left-padded
    np.testing.assert_array_equal(mask[1], [0] * (bucket - 2) + [1, 1])
    np.testing.assert_array_equal(mask.sum(1), [longest, 2])

  def test_too_long_for_every_bucket(self):
    with self.assertRaisesRegex(ValueError, "17 tokens is longer than the largest"):
      data.pad_to_bucket([[1] * 17], (8, 16), pad_id=0)

  def test_tokenize_prompts(self):
    out = data.tokenize_prompts(self.tok["plain"], ["12+7*3=", "1+1=", "x" * 20],
                                data_cfg(max_prompt_len=12, prompt_overflow="truncate"),
                                (8, 16, 32))
    self.assertEqual(out.tokens.shape, (3, 16))
    self.assertEqual(out.num_truncated, 1)
    self.assertEqual(out.token_lists[2], ids("x" * 12))
    np.testing.assert_array_equal(out.tokens[0], [0] * 9 + ids("12+7*3="))
    np.testing.assert_array_equal(out.mask.sum(1), [7, 4, 12])
    # Padding is where the mask is 0, and only there.
    np.testing.assert_array_equal(out.tokens == char_tokenizer.PAD_ID, out.mask == 0)

  def test_tokenize_prompts_overflow_error(self):
    with self.assertRaisesRegex(ValueError, "sample 0 \\(dataset index 9\\) is 20 tokens"):
      data.tokenize_prompts(self.tok["plain"], ["x" * 20], data_cfg(max_prompt_len=12),
                            (32,), indices=[9])


if __name__ == "__main__":
  absltest.main()
