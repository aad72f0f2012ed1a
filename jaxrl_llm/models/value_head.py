"""The critic's head: the policy backbone's final hidden states -> one value per position."""
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxrl_llm import sharding as sh


class ValueHead(nn.Module):
  """v[b, t] = h[b, t] . w + c, in float32.

  Zero-initialised, so a critic made from a policy checkpoint starts by predicting 0 for
  every state (the value of an unseen reward) instead of noise.
  """
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x_BTD):
    w_D = self.param("kernel", nn.with_logical_partitioning(nn.initializers.zeros, (sh.EMBED,)),
                     (x_BTD.shape[-1],), self.param_dtype)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ()), (),
                      self.param_dtype)
    values_BT = jnp.einsum("BTD,D->BT", x_BTD.astype(self.dtype), w_D.astype(self.dtype))
    return values_BT.astype(jnp.float32) + bias.astype(jnp.float32)
