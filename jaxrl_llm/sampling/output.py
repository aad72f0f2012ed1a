"""What a sampling call returns, whichever engine ran it (`SampleOutput`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm import sharding as sh


@struct.dataclass
class SampleOutput:
  """Completions of B = P*G rows, prompt-major (the G samples of prompt 0 come first).

  Attributes:
    tokens: int32 [B, N], `pad_id` after the end.
    mask: int32 [B, N], 1 on generated tokens up to and including EOS.
    logprobs: float32 [B, N], behaviour log-probs (0 where mask is 0).
    lengths: int32 [B], number of generated tokens (EOS included).
    truncated: bool [B], True when the row ended without an EOS (N tokens, or its budget).
    routing: an MoE model's experts int32 [B, S0 + N, MoE layers, k] (either engine; None
      for a dense model): at each prompt token and each completion token fed back, the k experts
      every MoE layer routed it to, -1 where none (the last token, the end); the prompt
      part is the prompt's, the same for its G rows. Routing replay trains on it.
  """
  tokens: jax.Array
  mask: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  truncated: jax.Array
  routing: jax.Array | None = None


def from_lengths(tokens_BN, logprobs_BN, lengths_B, ended_B) -> SampleOutput:
  """The output of completions with these tokens and lengths; `ended_B`: ended by an EOS
  (the others reached their budget: truncated)."""
  N = tokens_BN.shape[1]
  mask_BN = (jnp.arange(N)[None, :] < lengths_B[:, None]).astype(jnp.int32)
  return SampleOutput(tokens=tokens_BN, mask=mask_BN, logprobs=logprobs_BN, lengths=lengths_B,
                      truncated=~ended_B)


def by_rows(out: SampleOutput, model) -> SampleOutput:
  """`out` split by rows over the mesh's batch axes, other axes whole, as the prompts were:
  each process's rows on its own devices (`distributed.local_rows` reads them there)."""
  if model.mesh is None:
    return out
  return jax.tree.map(lambda x: sh.constrain(x, (sh.BATCH,) + (None,) * (x.ndim - 1),
                                             model.mesh, model.rules), out)
