"""The training batch: a rollout's rows as the compiled programs read them."""
from __future__ import annotations

from typing import Any

from flax import struct


@struct.dataclass
class TrainBatch:
  """B rows (prompt-major, G per prompt): prompt (left-padded) + completion, and per-token
  arrays over the N completion positions. Which optional fields are set (not None) is the
  plan's decision (`plan.Plan`), made once: a field is None for every step of a run or for
  none, so the programs compile once.

  Filled from the rollout (`prepare.batch_arrays`):
    tokens, attention_mask: int32 [B, S0 + N]; loss_mask: int32 [B, N], the tokens that
      carry loss.
    rewards: float32 [B] (read by `prepare`, not by the update).
    sampler_logp: float32 [B, N], the behaviour log-probs (sampled rollouts).
    echo_weights: float32 [B, N], echo's weight of each environment token.
    turn_rewards: float32 [B, N], each episode turn's step reward on its last token.
    routing: int32 [B, S0 + N, MoE layers, k], the experts the sampler routed each token
      to (-1: none recorded): replayed with `algo.routing_replay = 'rollout'`, compared
      with the update's own choice (`moe/routing_mismatch`) either way.
    source_index: int32 [B], each row's source (its index in `Plan.sources`) in a mixed run.
    hint_tokens, hint_attention_mask: int32 [B, S0 + H + N], the completions after their
      prompt's hint (self-distillation).
  Filled by `prepare.prepare_batch` (the update reads these):
    advantages: float32 [B, N] (or [B]).
    old_logp: [B, N] (None: the update's own log-probs, stop-gradient).
    ref_logp: [B, N] with the KL in the loss; teacher_logp: [B, N] with a distillation term.
    pg_weight, distill_weight: float32 [B], a mixed run's per-row coefficients of the
      loss's terms (`objectives.policy_loss`).
    old_values, returns: [B, N] for the value step; value_mask: [B, N] in a mixed run (the
      tokens of its gae sources' rows).
  """
  tokens: Any
  attention_mask: Any
  loss_mask: Any
  rewards: Any = None
  sampler_logp: Any = None
  echo_weights: Any = None
  turn_rewards: Any = None
  routing: Any = None
  source_index: Any = None
  hint_tokens: Any = None
  hint_attention_mask: Any = None
  advantages: Any = None
  old_logp: Any = None
  ref_logp: Any = None
  teacher_logp: Any = None
  pg_weight: Any = None
  distill_weight: Any = None
  old_values: Any = None
  returns: Any = None
  value_mask: Any = None

  def fields(self) -> dict[str, Any]:
    """The fields that are set, by name."""
    return {k: v for k, v in vars(self).items() if v is not None}
