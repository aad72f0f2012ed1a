"""The token choice of a decode step: an exact draw from the tempered softmax, after
top-k / top-p, with the behaviour log-prob of the chosen token.

Every request (one completion: row b = p*G + g of a call) draws from its own keys: the
token of its column t uses `token_keys(request_keys(key, R), t)`, that is
fold_in(fold_in(key, request), t). What a request samples therefore depends only on the
call's key, its index and its own tokens, not on which rows run beside it or when it
starts: the static and the continuous engines give a request the same completion.
"""
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
    scaled_BV = _nucleus(scaled_BV, top_p)
  return scaled_BV


def _nucleus(scaled_BV: jax.Array, top_p) -> jax.Array:
  """Logits outside the top-p nucleus set to -inf (`top_p`: a float, or [B, 1] per row)."""
  probs_BV = jax.nn.softmax(scaled_BV, axis=-1)
  sorted_BV = jnp.sort(probs_BV, axis=-1)[:, ::-1]
  # Keep the smallest prefix of the sorted tokens whose mass reaches top_p (at least one).
  keep_BV = (jnp.cumsum(sorted_BV, axis=-1) - sorted_BV) < top_p
  threshold_B1 = jnp.min(jnp.where(keep_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(probs_BV < threshold_B1, -jnp.inf, scaled_BV)


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


def request_keys(key: jax.Array, num_requests: int, first=0) -> jax.Array:
  """One key per request: fold_in(key, r) for r in [first, first + num_requests)."""
  return numbered_keys(key, first + jnp.arange(num_requests))


def numbered_keys(key: jax.Array, numbers) -> jax.Array:
  """One key per request number: fold_in(key, r) for r in `numbers` (request_keys' rule for
  requests numbered out of order, e.g. by their row in a batch spanning processes)."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.asarray(numbers, jnp.int32))


def token_keys(keys_B: jax.Array, t) -> jax.Array:
  """The keys of column t (an int or one per row) of the requests whose keys are `keys_B`."""
  t_B = jnp.broadcast_to(jnp.asarray(t, jnp.int32), keys_B.shape[:1])
  return jax.vmap(jax.random.fold_in)(keys_B, t_B)


def _argmax_rows(x_BV: jax.Array) -> jax.Array:
  """argmax over the last axis (first index of the maximum) as two one-operand reductions
  (an argmax is a two-operand reduce, slow on a CPU)."""
  vocab_V = jnp.arange(x_BV.shape[-1], dtype=jnp.int32)
  top_B1 = jnp.max(x_BV, axis=-1, keepdims=True)
  return jnp.min(jnp.where(x_BV == top_B1, vocab_V, x_BV.shape[-1]), axis=-1)


def choose_tokens(logits_BV: jax.Array, keys_B: jax.Array, s: SamplingSettings):
  """Samples one token per row; returns (token int32 [B], behaviour log-prob float32 [B]).

  Gumbel-max: the token is argmax(logits / T + g) with independent Gumbel noise g per row
  and token (`gumbel_noise`), an exact draw from softmax(logits / T) after top-k / top-p,
  at any vocabulary size: no cumulative sum whose float32 rounding (about 1e-5 absolute
  over 150k tokens) would misplace the tokens near its top. `keys_B`: each row's key for
  this token (`token_keys`; unused when greedy).
  """
  logits_BV = logits_BV.astype(jnp.float32)
  if s.temperature == 0:
    token_B = _argmax_rows(logits_BV)
    logp_BV = jax.nn.log_softmax(logits_BV, axis=-1)
  else:
    scaled_BV = logits_BV / s.temperature
    logp_BV = jax.nn.log_softmax(scaled_BV, axis=-1)  # before truncation: see module doc
    noise_BV = jax.vmap(gumbel_noise, in_axes=(0, None))(keys_B, scaled_BV.shape[-1:])
    noisy_BV = _truncate(scaled_BV, s.top_k, s.top_p) + noise_BV
    token_B = _argmax_rows(noisy_BV)
  logp_B = jnp.take_along_axis(logp_BV, token_B[:, None], axis=-1)[:, 0]
  return token_B.astype(jnp.int32), logp_B


def choose_rows(logits_BV: jax.Array, keys_B: jax.Array, temperature_B: jax.Array,
                top_p_B: jax.Array):
  """`choose_tokens` with each row's own temperature (0: greedy) and top-p (no top-k), for
  a serving engine whose slots hold requests of different settings: a row's token and
  log-prob equal `choose_tokens`' under settings of its own temperature and top-p.

  Returns (token int32 [B], behaviour log-prob float32 [B], log-probs float32 [B, V]: the
  distribution the behaviour log-prob is read from, for a request's top log-probs).
  """
  logits_BV = logits_BV.astype(jnp.float32)
  greedy_B = temperature_B <= 0
  scaled_BV = logits_BV / jnp.where(greedy_B, 1.0, temperature_B)[:, None]
  logp_BV = jax.nn.log_softmax(scaled_BV, axis=-1)
  noise_BV = jax.vmap(gumbel_noise, in_axes=(0, None))(keys_B, scaled_BV.shape[-1:])

  def nucleus(x_BV):  # a row at top-p 1 keeps every token, as `_truncate` does
    return jnp.where(top_p_B[:, None] >= 1.0, x_BV, _nucleus(x_BV, top_p_B[:, None]))

  truncated_BV = jax.lax.cond(jnp.any(top_p_B < 1.0), nucleus, lambda x: x, scaled_BV)
  token_B = jnp.where(greedy_B, _argmax_rows(logits_BV), _argmax_rows(truncated_BV + noise_BV))
  logp_B = jnp.take_along_axis(logp_BV, token_B[:, None], axis=-1)[:, 0]
  return token_B.astype(jnp.int32), logp_B, logp_BV


def is_eos(token_B, s: SamplingSettings):
  """Whether each token ends its completion."""
  if not s.eos_ids:
    return jnp.zeros(token_B.shape, bool)
  return jnp.isin(token_B, jnp.asarray(s.eos_ids, jnp.int32))
