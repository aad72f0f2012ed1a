"""The KV cache: keys and values of every layer, preallocated to a fixed length S.

A cache is a tuple with one {'k': [B, K, S, Dh], 'v': [B, K, S, Dh]} per layer, so each
layer's buffer is updated in place and read where it lies. Heads come before slots:
attention reads each (row, kv head) block contiguously, with no transpose per step. Slots
are written (`dynamic_update_slice`) at a position shared by the whole batch: prompts are
left-padded to one length, so slot s holds token s of every row, and the per-row validity
of each slot travels separately as `kv_mask_BS`.
"""
import jax
import jax.numpy as jnp

from jaxrl_llm import sharding as sh
from jaxrl_llm.models.config import ModelConfig

LOGICAL_AXES = (sh.BATCH, sh.KV_HEADS, sh.CACHE_SEQ, sh.HEAD_DIM)


def layer_shape(cfg: ModelConfig, batch: int, length: int) -> tuple[int, ...]:
  return (batch, cfg.num_kv_heads, length, cfg.head_dim)


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=None) -> tuple[dict, ...]:
  """Zeros [B, K, S, Dh] for keys and values of each layer (dtype: the compute dtype)."""
  shape, dtype = layer_shape(cfg, batch, length), dtype or cfg.jnp_dtype
  return tuple({"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
               for _ in range(cfg.num_layers))


def cache_shardings(cfg: ModelConfig, batch: int, length: int, mesh, rules) -> tuple[dict, ...]:
  """NamedShardings of a cache made by `init_cache` on `mesh`."""
  one = sh.named_sharding(LOGICAL_AXES, layer_shape(cfg, batch, length), mesh, rules)
  return tuple({"k": one, "v": one} for _ in range(cfg.num_layers))
