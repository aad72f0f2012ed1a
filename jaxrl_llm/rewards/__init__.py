"""Reward functions and the weighted set a config names.

  from jaxrl_llm import rewards
  reward_set = rewards.RewardSet.from_config(config.rewards)
  out = reward_set(prompts, completions, **fields)  # out.total: float32 [B]
  metrics = out.means()                             # {'reward/<fn name>': mean, ...}

Modules: `reward_set` (`RewardSet`, `RewardError`), `expression` (the safe
integer-expression evaluator), and one module per reward family, each with
plain functions `fn(prompts, completions, **fields) -> list[float]`:

  jaxrl_llm.rewards.arithmetic:arithmetic_exact / arithmetic_format
  jaxrl_llm.rewards.countdown:countdown_exact   / countdown_format
  jaxrl_llm.rewards.gsm8k:gsm8k_exact           / gsm8k_format
  jaxrl_llm.rewards.math:math_verify            (Hugging Face's math-verify; `math_worker`
                                                is the child process it runs in)
"""
from jaxrl_llm.rewards.reward_set import RewardError
from jaxrl_llm.rewards.reward_set import Rewards
from jaxrl_llm.rewards.reward_set import RewardSet
