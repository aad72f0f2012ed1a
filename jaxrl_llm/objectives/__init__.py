"""RL objectives for LLMs as small pure functions, one setting per algorithm axis.

The contract is docs/objectives.md (axes, formulas, presets, this API). The trainer never
branches on an algorithm's name: `config.algo` names a choice per axis, and the tables
below resolve it (`jaxrl_llm.config.validate_algo` checks the choices).

  from jaxrl_llm import objectives
  adv = objectives.outcome_advantages(rewards, cfg)                   # [P, G] -> [P, G]
  adv, ret = objectives.gae(token_rewards, values, mask, gamma, lam)  # [B, T] each
  kl = objectives.kl_divergence(logp, ref_logp, estimator)            # [B, T]
  loss, metrics = objectives.policy_loss(logp, old_logp, advantages, mask, cfg,
                                         ref_logp=None, entropy=None, counts=None)
  loss, metrics = objectives.value_loss(values, old_values, returns, mask, cfg)

Modules: `logprobs` (per-token logp and entropy, chunked), `advantages`, `kl`,
`aggregation` (loss reductions and exact accumulation), `losses` (ratios, trust
regions, policy and value losses), `distillation` (a teacher's log-probs as a loss term
or advantage shaping), `shaping` (DAPO extras, truncated IS, behaviour masking), `echo`
(prime-rl's cross-entropy on environment tokens of multi-turn episodes).
"""
from jaxrl_llm.objectives.advantages import ESTIMATORS
from jaxrl_llm.objectives.advantages import OUTCOME_ESTIMATORS
from jaxrl_llm.objectives.advantages import STATEFUL_ESTIMATORS
from jaxrl_llm.objectives.advantages import discounted_returns
from jaxrl_llm.objectives.advantages import gae
from jaxrl_llm.objectives.advantages import kl_penalised_rewards
from jaxrl_llm.objectives.advantages import masked_whiten
from jaxrl_llm.objectives.advantages import outcome_advantages
from jaxrl_llm.objectives.advantages import outcome_token_rewards
from jaxrl_llm.objectives.advantages import rae_baselines
from jaxrl_llm.objectives.advantages import token_advantages
from jaxrl_llm.objectives.advantages import zero_variance_group_frac
from jaxrl_llm.objectives.aggregation import AGGREGATIONS
from jaxrl_llm.objectives.aggregation import batch_counts
from jaxrl_llm.objectives.aggregation import loss_counts
from jaxrl_llm.objectives.distillation import reverse_kl
from jaxrl_llm.objectives.distillation import reverse_kl_loss
from jaxrl_llm.objectives.distillation import shaped_advantages as distill_shaped_advantages
from jaxrl_llm.objectives.echo import echo_count
from jaxrl_llm.objectives.echo import echo_loss
from jaxrl_llm.objectives.echo import echo_weights
from jaxrl_llm.objectives.kl import KL_ESTIMATORS
from jaxrl_llm.objectives.kl import kl_divergence
from jaxrl_llm.objectives.logprobs import chunked_token_logp_and_entropy
from jaxrl_llm.objectives.logprobs import token_entropy
from jaxrl_llm.objectives.logprobs import token_logp
from jaxrl_llm.objectives.logprobs import token_logp_and_entropy
from jaxrl_llm.objectives.losses import RATIOS
from jaxrl_llm.objectives.losses import TRUST_REGIONS
from jaxrl_llm.objectives.losses import policy_loss
from jaxrl_llm.objectives.losses import value_loss
from jaxrl_llm.objectives.shaping import BEHAVIOUR_MASK_LEVELS
from jaxrl_llm.objectives.shaping import behaviour_mask
from jaxrl_llm.objectives.shaping import drop_truncated
from jaxrl_llm.objectives.shaping import dynamic_sampling_keep
from jaxrl_llm.objectives.shaping import overlong_penalty
from jaxrl_llm.objectives.shaping import overlong_shaped_rewards
from jaxrl_llm.objectives.shaping import truncated_importance_weight
