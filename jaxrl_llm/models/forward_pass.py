"""The forward pass of a `Model`: inside a caller's jit, and jitted logits and values.

```python
logits = models.compute_logits(model, input_ids, attention_mask)  # int [B, T] -> float32 [B, T, V]
out, cache = models.forward(model, tokens_BT, positions_BT, kv_mask_BS)  # in your own jit
```
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_llm.models.model import Model
from jaxrl_llm.models.transformer import Transformer

# XLA options for every program that runs a model. Without excess precision a bf16 program
# rounds every op as written, so two programs that compute the same forward (the update's
# and the one that scores its old log-probs) agree bit for bit, and the sampler's decode
# agrees with both up to its own op order. With XLA's default, fusion decides which bf16
# intermediates stay float32, so the same forward rounds differently in two programs: enough
# for a narrow trust region (GSPO's) to clip part of a first pass, where the ratio is 1 by
# definition (README, "bf16", has the figures). No effect in float32.
COMPILER_OPTIONS = {"xla_allow_excess_precision": False}


def positions_from_mask(mask_BT: jax.Array) -> jax.Array:
  """Position ids that ignore left padding: clip(cumsum(mask) - 1, 0)."""
  return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=-1) - 1, 0)


def forward(model: Model, tokens_BT, positions_BT, kv_mask_BS, cache=None, cache_index=0,
            return_hidden=False, rope=None, routing_BTLk=None, with_router=False,
            dropout_rng=None):
  """One call of the transformer (not jitted: call it inside your own jitted function).

  `rope`: the positions' (cos, sin) tables when the caller computes them itself.
  An MoE model: `routing_BTLk` replays recorded experts (int32 [B, T, MoE layers, k], -1:
  the live choice), and `with_router` adds its routing to the result
  (`transformer.routing_summary`; None for a dense model). `dropout_rng`: the key of the
  LoRA adapters' dropout (`ModelConfig.lora_dropout`; None: no dropout).
  Returns (logits [B, T, V] float32 | values [B, T] | hidden [B, T, D], new cache or None
  [, routing]).
  """
  rngs = None if dropout_rng is None else {"dropout": dropout_rng}
  return model.module.apply({"params": model.params}, tokens_BT, positions_BT, kv_mask_BS,
                            cache, cache_index, return_hidden, rope, routing_BTLk, with_router,
                            rngs=rngs)


def unembed(model: Model, hidden_BTD):
  """Final hidden states -> float32 logits (or values); for chunked log-prob computation."""
  return model.module.apply({"params": model.params}, hidden_BTD, method=Transformer.unembed)


def _check_inputs(input_ids, attention_mask):
  input_ids, attention_mask = jnp.asarray(input_ids), jnp.asarray(attention_mask)
  if input_ids.ndim != 2 or input_ids.shape != attention_mask.shape:
    raise ValueError(f"input_ids {input_ids.shape} and attention_mask {attention_mask.shape} "
                     "must both be [batch, length]")
  if not jnp.issubdtype(input_ids.dtype, jnp.integer):
    raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
  return input_ids.astype(jnp.int32), attention_mask.astype(jnp.int32)


@functools.partial(jax.jit, compiler_options=COMPILER_OPTIONS)
def _full_forward(model: Model, input_ids, attention_mask):
  out, _ = forward(model, input_ids, positions_from_mask(attention_mask), attention_mask)
  return out


def compute_logits(model: Model, input_ids, attention_mask) -> jax.Array:
  """Float32 next-token logits [B, T, V] of int tokens [B, T]; left padding is ignored."""
  if model.config.head != "lm":
    raise ValueError("compute_logits needs a language model (head='lm'); use compute_values")
  return _full_forward(model, *_check_inputs(input_ids, attention_mask))


def compute_values(model: Model, input_ids, attention_mask) -> jax.Array:
  """Float32 values [B, T] of a critic made by `value_model`."""
  if model.config.head != "value":
    raise ValueError("compute_values needs a value model; make one with models.value_model(policy)")
  return _full_forward(model, *_check_inputs(input_ids, attention_mask))
