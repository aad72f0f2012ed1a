"""Prompts -> token ids: template, encode, limit the length, left-pad to a bucket.

Special tokens. With `config.data.chat_template`, a prompt becomes the single
user turn of the tokenizer's chat template with the generation prompt appended,
and that text is encoded *without* added special tokens: templates write their
own BOS (Llama 3, Gemma), and adding another would double it. Without a
template the raw prompt is encoded without special tokens, and a BOS is put in
front only when the tokenizer itself would add one (its post-processor puts
`bos_token_id` first, as Llama's and Gemma's do; Qwen's and the character
tokenizer's do not). No EOS is ever added: the prompt continues into the
completion.

Length. Prompts longer than `config.data.max_prompt_len` tokens either stop the
run (`prompt_overflow='error'`, naming the sample, its length and the limit) or
keep their last `max_prompt_len` tokens (`'truncate'`: left truncation keeps the
question's end, next to where the answer starts; a leading BOS is kept). The
number truncated is returned for the trainer's metrics.

Padding. A batch is left-padded to the smallest of `config.sampling.prompt_buckets`
that holds its longest prompt, so the sampler compiles once per bucket.
"""
import dataclasses
from typing import Sequence

import numpy as np

from jaxrl_llm import paths

OVERFLOW_MODES = ("error", "truncate")


@dataclasses.dataclass(frozen=True)
class TokenizedPrompts:
  """A batch of prompts as tokens.

  Attributes:
    token_lists: B lists of ids, unpadded (the sampler's `list[list[int]]`).
    tokens: int32 [B, S], left-padded with the pad id; S is the bucket.
    mask: int32 [B, S], 1 on prompt tokens, 0 on padding.
    num_truncated: prompts shortened to `max_prompt_len`.
  """
  token_lists: list[list[int]]
  tokens: np.ndarray
  mask: np.ndarray
  num_truncated: int


def run_tokenizer(model_cfg):
  """The tokenizer of a run's `config.model`: `tokenizer_path`'s, else `path`'s, else the
  built-in character tokenizer sized to `arch.vocab_size`."""
  from jaxrl_llm.data import char_tokenizer  # pylint: disable=g-import-not-at-top
  if model_cfg.tokenizer_path or model_cfg.path:
    return load_tokenizer(model_cfg.tokenizer_path or model_cfg.path)
  return char_tokenizer.build_char_tokenizer(vocab_size=model_cfg.arch.vocab_size)


def load_tokenizer(path: str):
  """A transformers tokenizer from a directory, local or gs:// (never the hub).

  transformers reads only local directories: a gs:// one is read from its local copy
  (`paths.local_copy`).
  """
  import transformers  # pylint: disable=g-import-not-at-top

  if not paths.isdir(path):
    raise FileNotFoundError(f"Tokenizer directory {path!r} does not exist.")
  return transformers.AutoTokenizer.from_pretrained(paths.local_copy(path), local_files_only=True)


def render_prompt(tokenizer, prompt: str, *, chat_template: bool) -> str:
  """The text to encode: the prompt itself, or its chat-template rendering."""
  if not chat_template:
    return prompt
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError("config.data.chat_template is True but the tokenizer has no chat "
                     "template; set it to False or use a tokenizer that has one.")
  return tokenizer.apply_chat_template(
      [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)


def wants_bos(tokenizer) -> bool:
  """True if the tokenizer's own special-token handling puts BOS first."""
  bos = tokenizer.bos_token_id
  if bos is None:
    return False
  with_specials = tokenizer.encode("a", add_special_tokens=True)
  without = tokenizer.encode("a", add_special_tokens=False)
  return with_specials[:1] == [bos] and without[:1] != [bos]


def encode_prompts(tokenizer, prompts: Sequence[str], *, max_prompt_len: int,
                   overflow: str = "error", chat_template: bool = False,
                   indices: Sequence[int] | None = None) -> tuple[list[list[int]], int]:
  """Encodes prompts and applies the length limit (see the module docstring).

  Args:
    tokenizer: a transformers tokenizer.
    prompts: B prompt strings.
    max_prompt_len: the most tokens a prompt may have; 0 means no limit here
      (the largest bucket still limits it in `pad_to_bucket`).
    overflow: 'error' or 'truncate'.
    chat_template: render each prompt with the tokenizer's chat template.
    indices: the prompts' dataset indices, to name a sample in an error.

  Returns:
    (B token lists, number of prompts truncated).
  """
  if overflow not in OVERFLOW_MODES:
    raise ValueError(f"config.data.prompt_overflow must be one of {OVERFLOW_MODES}, "
                     f"got {overflow!r}.")
  texts = [render_prompt(tokenizer, p, chat_template=chat_template) for p in prompts]
  if not texts:
    return [], 0
  token_lists = [list(ids) for ids in
                 tokenizer(texts, add_special_tokens=False)["input_ids"]]
  bos = tokenizer.bos_token_id
  if not chat_template and wants_bos(tokenizer):
    token_lists = [[bos] + ids for ids in token_lists]
  num_truncated = 0
  for i, ids in enumerate(token_lists):
    if max_prompt_len <= 0 or len(ids) <= max_prompt_len:
      continue
    if overflow == "error":
      which = f"dataset index {indices[i]}" if indices is not None else f"batch index {i}"
      raise ValueError(
          f"Prompt of sample {i} ({which}) is {len(ids)} tokens, longer than "
          f"config.data.max_prompt_len={max_prompt_len}: {prompts[i][:80]!r}... Set "
          "config.data.prompt_overflow='truncate' to keep its last tokens instead.")
    keep_bos = bos is not None and ids[0] == bos and max_prompt_len > 1
    token_lists[i] = ([bos] + ids[len(ids) - max_prompt_len + 1:] if keep_bos
                      else ids[len(ids) - max_prompt_len:])
    num_truncated += 1
  return token_lists, num_truncated


def pad_to_bucket(token_lists: Sequence[Sequence[int]], buckets: Sequence[int],
                  pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads to the smallest bucket that holds the longest list.

  Args:
    token_lists: B lists of ids.
    buckets: allowed padded lengths (config.sampling.prompt_buckets).
    pad_id: the id padding positions get.

  Returns:
    tokens int32 [B, S] and mask int32 [B, S] (1 = token), S the bucket.
  """
  if not buckets:
    raise ValueError("config.sampling.prompt_buckets is empty.")
  longest = max((len(ids) for ids in token_lists), default=0)
  fits = [b for b in sorted(buckets) if b >= longest]
  if not fits:
    raise ValueError(f"A prompt of {longest} tokens is longer than the largest of "
                     f"config.sampling.prompt_buckets {tuple(buckets)}; add a bucket "
                     "or lower config.data.max_prompt_len.")
  size = fits[0]
  tokens = np.full([len(token_lists), size], pad_id, np.int32)  # [B, S]
  mask = np.zeros([len(token_lists), size], np.int32)  # [B, S]
  for row, ids in enumerate(token_lists):
    if ids:
      tokens[row, size - len(ids):] = ids
      mask[row, size - len(ids):] = 1
  return tokens, mask


def tokenize_prompts(tokenizer, prompts: Sequence[str], data_cfg,
                     buckets: Sequence[int], *,
                     indices: Sequence[int] | None = None) -> TokenizedPrompts:
  """Encodes, limits and pads a batch of prompts.

  Args:
    tokenizer: a transformers tokenizer with a pad (or else EOS) token.
    prompts: B prompt strings.
    data_cfg: `config.data`; reads `max_prompt_len`, `prompt_overflow`,
      `chat_template`.
    buckets: `config.sampling.prompt_buckets`.
    indices: the prompts' dataset indices, named in an overflow error.

  Returns:
    `TokenizedPrompts`.
  """
  token_lists, num_truncated = encode_prompts(
      tokenizer, prompts, max_prompt_len=data_cfg.max_prompt_len,
      overflow=data_cfg.prompt_overflow, chat_template=data_cfg.chat_template,
      indices=indices)
  pad_id = tokenizer.pad_token_id
  if pad_id is None:
    pad_id = tokenizer.eos_token_id
  if pad_id is None:
    raise ValueError("The tokenizer has neither a pad nor an EOS token to pad with.")
  tokens, mask = pad_to_bucket(token_lists, buckets, pad_id)
  return TokenizedPrompts(token_lists=token_lists, tokens=tokens, mask=mask,
                          num_truncated=num_truncated)


@dataclasses.dataclass(frozen=True)
class PromptFormat:
  """How a run's prompts become token ids: `config.data`'s length limit, overflow rule and
  chat template, and `config.sampling.prompt_buckets` (`from_config`)."""
  max_prompt_len: int
  prompt_overflow: str
  chat_template: bool
  buckets: tuple[int, ...]

  @classmethod
  def from_config(cls, config) -> "PromptFormat":
    d = config.data
    return cls(int(d.max_prompt_len), d.prompt_overflow, bool(d.chat_template),
               tuple(int(b) for b in config.sampling.prompt_buckets))

  def tokenize(self, tokenizer, prompts: Sequence[str], *,
               indices: Sequence[int] | None = None) -> TokenizedPrompts:
    """`tokenize_prompts` with this format."""
    return tokenize_prompts(tokenizer, prompts, self, self.buckets, indices=indices)
