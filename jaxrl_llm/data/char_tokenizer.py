"""A character-level tokenizer over printable ASCII, as a transformers tokenizer.

Built from `tokenizers` (WordLevel model, one token per character) and wrapped in
`PreTrainedTokenizerFast`, so it saves with `save_pretrained` and loads back with
`AutoTokenizer.from_pretrained` like any checkpoint's tokenizer. The demo ships
one built here; tests build their own in a temporary directory. Ids:

  0 <pad>, 1 <bos>, 2 <eos>, 3 <unk>, then 4 + (ord(c) - 32) for the 95 printable
  ASCII characters ' ' .. '~' (so 'a' is 69), then optional fillers `<x0>, <x1>,
  ...` up to `vocab_size` (to match a model's embedding size).

Anything else (a newline, a non-ASCII letter) encodes as <unk>. By default
nothing is added around a text (no BOS/EOS): `"12+7*3="` is exactly 7 tokens.
`add_bos=True` makes the tokenizer's post-processor prepend <bos>, which
`jaxrl_llm.data.prompts` then honours.
"""
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
CHARS = tuple(chr(c) for c in range(32, 127))  # the 95 printable ASCII characters

# "U:<user text> A:" per turn; a generation prompt ends in "A:". Printable ASCII only.
SIMPLE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'][0] | upper }}:{{ message['content'] }} "
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}")


def vocab(vocab_size: int | None = None) -> list[str]:
  """The tokens in id order; padded with `<xN>` fillers to `vocab_size` if given."""
  tokens = list(SPECIALS) + list(CHARS)
  if vocab_size is not None:
    if vocab_size < len(tokens):
      raise ValueError(f"vocab_size {vocab_size} < the {len(tokens)} tokens needed.")
    tokens += [f"<x{i}>" for i in range(vocab_size - len(tokens))]
  return tokens


def build_char_tokenizer(path: str | None = None, *, vocab_size: int | None = None,
                         add_bos: bool = False,
                         chat_template: str | None = None) -> PreTrainedTokenizerFast:
  """Builds the tokenizer and, if `path` is given, saves it there.

  Args:
    path: directory for `save_pretrained`; None keeps it in memory only.
    vocab_size: pad the vocabulary to this size (e.g. the model's 512).
    add_bos: prepend <bos> when encoding with special tokens.
    chat_template: a Jinja chat template, e.g. `SIMPLE_CHAT_TEMPLATE`.

  Returns:
    The tokenizer, left-padding, with pad/bos/eos/unk set.
  """
  # Imported here: only building (not loading) a tokenizer needs `tokenizers` directly.
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

  ids = {token: i for i, token in enumerate(vocab(vocab_size))}
  tok = Tokenizer(models.WordLevel(vocab=ids, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  tok.decoder = decoders.Fuse()
  if add_bos:
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)])
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
      unk_token="<unk>")
  fast.padding_side = "left"
  if chat_template is not None:
    fast.chat_template = chat_template
  if path is not None:
    fast.save_pretrained(path)
  return fast
