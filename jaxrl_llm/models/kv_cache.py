"""The KV cache: keys and values of every layer, preallocated to a fixed length S.

A cache is a dict {'k': [L, B, S, K, Dh], 'v': [L, B, S, K, Dh]}; the transformer's layer
scan hands each layer its [B, S, K, Dh] slice. Slots are written in place
(`dynamic_update_slice`) at a position shared by the whole batch: prompts are left-padded
to one length, so slot s holds token s of every row, and the per-row validity of each slot
travels separately as `kv_mask_BS`.
"""
import jax
import jax.numpy as jnp

from jaxrl_llm import sharding as sh
from jaxrl_llm.models.config import ModelConfig

LOGICAL_AXES = (sh.LAYERS, sh.BATCH, sh.CACHE_SEQ, sh.KV_HEADS, sh.HEAD_DIM)


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=None) -> dict[str, jax.Array]:
  """Zeros of shape [L, B, S, K, Dh] for keys and values (dtype: the compute dtype)."""
  shape = (cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim)
  dtype = dtype or cfg.jnp_dtype
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def cache_shardings(cfg: ModelConfig, batch: int, length: int, mesh, rules):
  """NamedShardings of a cache made by `init_cache` on `mesh`."""
  shape = (cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim)
  one = sh.named_sharding(LOGICAL_AXES, shape, mesh, rules)
  return {"k": one, "v": one}
