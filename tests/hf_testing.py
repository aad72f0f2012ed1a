"""Tiny random Hugging Face checkpoints, built locally with transformers (never downloaded)."""
import os

import numpy as np
import torch
import transformers

ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
}
# The MoE sizes of the tiny models: 6 experts of width 20, 2 per token.
TINY_MOE = {"qwen3_moe": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=20,
                              head_dim=12),
            "mixtral": dict(num_local_experts=6, num_experts_per_tok=2, intermediate_size=20,
                            sliding_window=None)}

# Odd sizes on purpose: nothing may silently rely on powers of two.
TINY = dict(vocab_size=97, hidden_size=40, intermediate_size=72, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def make_hf_model(arch: str, *, tied: bool = False, seed: int = 0, **overrides):
  """A random tiny PyTorch model; every parameter (biases and norms too) is perturbed."""
  config_cls, model_cls = ARCHS[arch]
  kw = dict(TINY, tie_word_embeddings=tied)
  if arch == "qwen3":
    kw["head_dim"] = 12  # != hidden / heads, as in real Qwen3 checkpoints
  kw.update(TINY_MOE.get(arch, {}))
  kw.update(overrides)
  torch.manual_seed(seed)
  model = model_cls(config_cls(**kw)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  return model


def save_hf_model(model, path: str, **kw) -> str:
  os.makedirs(path, exist_ok=True)
  model.save_pretrained(path, **kw)
  return path


def hf_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Reference float32 logits; positions skip left padding (transformers does not by itself)."""
  positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions))
  return out.logits.float().numpy()


def left_padded_batch(rows, pad_id: int = 0):
  """Token lists -> (ids, mask) [B, T], left-padded to the longest row."""
  T = max(len(r) for r in rows)
  ids = np.full((len(rows), T), pad_id, np.int64)
  mask = np.zeros((len(rows), T), np.int64)
  for i, r in enumerate(rows):
    ids[i, T - len(r):] = r
    mask[i, T - len(r):] = 1
  return ids, mask
