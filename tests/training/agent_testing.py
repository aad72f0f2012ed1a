"""A tiny model that ends its turns often, a character tokenizer with a tool chat template,
and a scripted environment: what the multi-turn trainer tests run on (built locally)."""
import os

import numpy as np
import torch
import transformers

from jaxrl_llm import envs
from jaxrl_llm.data import char_tokenizer

VOCAB = 128
SCRIPTED_ENV = os.path.join(os.path.dirname(__file__), "scripted_env.py")


def make_model_dir(path: str, *, eos_logit: float = 1.2, seed: int = 0,
                   chat_template: str = envs.CHAR_TOOL_CHAT_TEMPLATE, moe: bool = False) -> str:
  """A random tiny Llama (`moe`: Qwen3-MoE, 8 experts, 2 per token) over the character
  tokenizer whose EOS (the end-of-turn token of `envs.CHAR_TOOL_CHAT_TEMPLATE`) is likely
  enough that turns end within a few tokens: the embeddings share a constant direction,
  which the EOS row of the unembedding reads."""
  torch.manual_seed(seed)
  shape = dict(vocab_size=VOCAB, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               rms_norm_eps=1e-6, bos_token_id=char_tokenizer.BOS_ID,
               eos_token_id=char_tokenizer.EOS_ID, pad_token_id=char_tokenizer.PAD_ID,
               tie_word_embeddings=False)
  if moe:
    cfg = transformers.Qwen3MoeConfig(**shape, head_dim=10, num_experts=8, num_experts_per_tok=2,
                                      moe_intermediate_size=32, norm_topk_prob=True)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
  else:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
    model.model.embed_tokens.weight[:, 0] = 1.0
    model.lm_head.weight[char_tokenizer.EOS_ID] = 0.0
    model.lm_head.weight[char_tokenizer.EOS_ID, 0] = eos_logit
  os.makedirs(path, exist_ok=True)
  model.save_pretrained(path)
  char_tokenizer.build_char_tokenizer(path, vocab_size=VOCAB,
                                      chat_template=chat_template)
  return path
