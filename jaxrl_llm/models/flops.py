"""Model FLOPs of a forward pass, from a model's architecture (`ModelConfig`): what
`training.flops` counts for a step and the judge for its scoring."""
from __future__ import annotations


def layer_params(c, kind: str = "dense") -> int:
  """Weights of one layer that do one multiply-add per token (q, k, v, o, gate, up, down):
  an MoE layer counts its active parameters, the router and the k experts a token uses."""
  attention = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
  if kind == "moe":
    return (attention + c.hidden_size * c.num_experts
            + 3 * c.hidden_size * c.moe_intermediate_size * c.num_experts_per_tok)
  return attention + 3 * c.hidden_size * c.intermediate_size


def active_layer_params(c) -> int:
  """`layer_params` summed over the layers (dense and MoE as `ModelConfig.layer_kinds`)."""
  kinds = getattr(c, "layer_kinds", ("dense",) * c.num_layers)
  return sum(layer_params(c, kind) for kind in kinds)


def forward_flops(c, tokens: float, context: float, unembedded: float | None = None) -> float:
  """A forward pass over `tokens` tokens whose queries see `context` keys on average.

  `unembedded`: how many of them are projected to the vocabulary (default: all).
  """
  unembedded = tokens if unembedded is None else unembedded
  attention = 4 * c.num_layers * c.num_heads * c.head_dim * context  # q.k and p.v
  return (tokens * (2 * active_layer_params(c) + attention)
          + unembedded * 2 * c.hidden_size * c.vocab_size)
