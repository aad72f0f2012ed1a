"""The token choice of a decode step: an exact draw from the tempered softmax, after
top-k / top-p, with the behaviour log-prob of the chosen token."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.sampling.settings import SamplingSettings


def _truncate(scaled_BV: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """Sets logits outside the top-k, then outside the top-p nucleus, to -inf."""
  if top_k and top_k < scaled_BV.shape[-1]:
    kth_B1 = jax.lax.top_k(scaled_BV, top_k)[0][:, -1:]
    scaled_BV = jnp.where(scaled_BV < kth_B1, -jnp.inf, scaled_BV)
  if top_p < 1.0:
    probs_BV = jax.nn.softmax(scaled_BV, axis=-1)
    sorted_BV = jnp.sort(probs_BV, axis=-1)[:, ::-1]
    # Keep the smallest prefix of the sorted tokens whose mass reaches top_p (at least one).
    keep_BV = (jnp.cumsum(sorted_BV, axis=-1) - sorted_BV) < top_p
    threshold_B1 = jnp.min(jnp.where(keep_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    scaled_BV = jnp.where(probs_BV < threshold_B1, -jnp.inf, scaled_BV)
  return scaled_BV


def gumbel_noise(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Gumbel(0, 1) noise, float32, from 32 random bits per entry.

  g = -log(E) with E = -log1p(-v) exponential and v = (bits + 1/2) / 2^32: small v, the
  upper tail of g that decides which rare token wins, is exact in float32, so g reaches
  -log(2^-33) = 22.9 (`jax.random.gumbel`'s 23-bit uniforms stop at 16.6, which cuts off
  tokens 1e-7 times as likely as the top one).
  """
  bits = jax.random.bits(key, shape, jnp.uint32)
  v = jnp.minimum((bits.astype(jnp.float32) + 0.5) * 2.0 ** -32, 1.0 - 2.0 ** -24)
  return -jnp.log(-jnp.log1p(-v))


def _argmax_rows(x_BV: jax.Array) -> jax.Array:
  """argmax over the last axis (first index of the maximum) as two one-operand reductions
  (an argmax is a two-operand reduce, slow on a CPU)."""
  vocab_V = jnp.arange(x_BV.shape[-1], dtype=jnp.int32)
  top_B1 = jnp.max(x_BV, axis=-1, keepdims=True)
  return jnp.min(jnp.where(x_BV == top_B1, vocab_V, x_BV.shape[-1]), axis=-1)


def choose_tokens(logits_BV: jax.Array, key: jax.Array, s: SamplingSettings):
  """Samples one token per row; returns (token int32 [B], behaviour log-prob float32 [B]).

  Gumbel-max: the token is argmax(logits / T + g) with independent Gumbel noise g per row
  and token (`gumbel_noise`), an exact draw from softmax(logits / T) after top-k / top-p,
  at any vocabulary size: no cumulative sum whose float32 rounding (about 1e-5 absolute
  over 150k tokens) would misplace the tokens near its top. `key`: this step's key (unused
  when greedy).
  """
  logits_BV = logits_BV.astype(jnp.float32)
  if s.temperature == 0:
    token_B = _argmax_rows(logits_BV)
    logp_BV = jax.nn.log_softmax(logits_BV, axis=-1)
  else:
    scaled_BV = logits_BV / s.temperature
    logp_BV = jax.nn.log_softmax(scaled_BV, axis=-1)  # before truncation: see module doc
    noisy_BV = _truncate(scaled_BV, s.top_k, s.top_p) + gumbel_noise(key, scaled_BV.shape)
    token_B = _argmax_rows(noisy_BV)
  logp_B = jnp.take_along_axis(logp_BV, token_B[:, None], axis=-1)[:, 0]
  return token_B.astype(jnp.int32), logp_B
