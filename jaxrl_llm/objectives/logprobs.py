"""Per-token log-probabilities and entropies from logits, in float32 and in chunks.

The behaviour log-prob of a sampled token is `log_softmax(logits / temperature)` at
that token (before any top-k/top-p truncation; temperature 0, greedy, counts as 1),
the same definition the sampler (`jaxrl_llm/sampling/`) records, so that
`logp == old_logp` on the first pass over a batch when the trainer and the sampler
agree.

Logits are cast to float32 before the softmax: bfloat16 log-probs are too coarse for
importance ratios `exp(logp - old_logp)` near 1.

A `[B, T, V]` float32 logit tensor is large (B=64, T=8k, V=150k is 300 GiB).
`chunked_token_logp_and_entropy` therefore takes the final hidden states and the
model's unembedding, and computes logits one sequence chunk at a time inside
`jax.checkpoint`: neither the forward pass nor the backward pass holds more than one
`[B, C, V]` chunk (tunix's `compute_logps_chunk_size` is the reference point).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def _log_softmax_f32(logits_BTV: Array, temperature: float) -> Array:
  """log_softmax(logits / temperature) in float32; temperature 0 (greedy) counts as 1."""
  if temperature == 0:  # the sampler records log_softmax(logits) for greedy decoding
    temperature = 1.0
  return jax.nn.log_softmax(logits_BTV.astype(jnp.float32) / temperature, axis=-1)


def token_logp(logits_BTV: Array, targets_BT: Array, temperature: float = 1.0) -> Array:
  """Log-probability of each target token.

  `logp[b, t] = log softmax(logits[b, t] / temperature)[targets[b, t]]`.

  Args:
    logits_BTV: logits that predict `targets_BT` (already shifted: position t's
      logits predict token t).
    targets_BT: int token ids.
    temperature: sampling temperature; the result is the log-prob of the tempered
      distribution the sampler drew from (0, greedy, counts as 1).

  Returns:
    `[B, T]` float32 log-probs.
  """
  logp_BTV = _log_softmax_f32(logits_BTV, temperature)
  return jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]


def token_entropy(logits_BTV: Array, temperature: float = 1.0) -> Array:
  """Entropy of each position's tempered distribution, `H = -Σ_v p_v log p_v`, float32."""
  logp_BTV = _log_softmax_f32(logits_BTV, temperature)
  return -jnp.sum(jnp.exp(logp_BTV) * logp_BTV, axis=-1)


def token_logp_and_entropy(
    logits_BTV: Array, targets_BT: Array, temperature: float = 1.0
) -> tuple[Array, Array]:
  """`token_logp` and `token_entropy` from one log_softmax.

  Returns:
    `(logp_BT, entropy_BT)`, both float32.
  """
  logp_BTV = _log_softmax_f32(logits_BTV, temperature)
  logp_BT = jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]
  entropy_BT = -jnp.sum(jnp.exp(logp_BTV) * logp_BTV, axis=-1)
  return logp_BT, entropy_BT


def chunked_token_logp_and_entropy(
    hidden_BTD: Array,
    targets_BT: Array,
    unembed_fn: Callable[[Array], Array],
    *,
    chunk_size: int,
    temperature: float = 1.0,
    entropy_grad: bool = True,
) -> tuple[Array, Array]:
  """`token_logp_and_entropy(unembed_fn(hidden), targets)` one sequence chunk at a time.

  The sequence is padded up to a multiple of `chunk_size` and cut into chunks; a
  `lax.map` over chunks runs `unembed_fn` and the float32 log_softmax on one
  `[B, C, D]` slice at a time. The chunk body is wrapped in `jax.checkpoint`, so the
  backward pass recomputes each chunk's logits instead of saving them: no `[B, T, V]`
  array exists in either pass, only `[B, C, V]`.

  Args:
    hidden_BTD: final hidden states (after the last norm) whose logits predict
      `targets_BT`.
    targets_BT: int token ids.
    unembed_fn: `hidden_BCD -> logits_BCV`, provided by the model (it may close
      over parameters; gradients flow to them).
    chunk_size: sequence positions per chunk; any T works (the tail is padded).
    temperature: as in `token_logp`.
    entropy_grad: whether the entropy is differentiated. False when it is only a metric
      (no entropy bonus): it is then computed from stop-gradient log-probs, and the
      backward pass does no work for it.

  Returns:
    `(logp_BT, entropy_BT)`, float32, equal to the unchunked computation.
  """
  B, T, D = hidden_BTD.shape
  C = min(chunk_size, T)
  N = -(-T // C)  # number of chunks, rounded up
  pad = N * C - T
  hidden_BSD = jnp.pad(hidden_BTD, ((0, 0), (0, pad), (0, 0)))  # S = N·C
  targets_BS = jnp.pad(targets_BT, ((0, 0), (0, pad)))
  hidden_NBCD = hidden_BSD.reshape(B, N, C, D).transpose(1, 0, 2, 3)
  targets_NBC = targets_BS.reshape(B, N, C).transpose(1, 0, 2)

  @jax.checkpoint  # recompute the chunk's logits in the backward pass; never save them
  def one_chunk(args):
    hidden_BCD, targets_BC = args
    logp_BCV = _log_softmax_f32(unembed_fn(hidden_BCD), temperature)
    logp_BC = jnp.take_along_axis(logp_BCV, targets_BC[..., None], axis=-1)[..., 0]
    if not entropy_grad:
      logp_BCV = jax.lax.stop_gradient(logp_BCV)
    return logp_BC, -jnp.sum(jnp.exp(logp_BCV) * logp_BCV, axis=-1)

  logp_NBC, entropy_NBC = jax.lax.map(one_chunk, (hidden_NBCD, targets_NBC))
  # [N, B, C] -> [B, N·C] -> drop the padding.
  logp_BT = logp_NBC.transpose(1, 0, 2).reshape(B, N * C)[:, :T]
  entropy_BT = entropy_NBC.transpose(1, 0, 2).reshape(B, N * C)[:, :T]
  return logp_BT, entropy_BT
