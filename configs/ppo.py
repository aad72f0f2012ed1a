"""PPO (RLHF form): value model + GAE, token clip, k1 KL charged in the reward.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347;
the LLM form of Ouyang et al. 2022 (InstructGPT), arXiv:2203.02155, with TRL's
defaults (γ = 1, λ = 0.95, whitened advantages, value clip 0.2, vf_coef 0.1,
4 PPO epochs per batch). Rewards: the outcome reward on the last token minus
`β·(logp - ref_logp)` on every token. One response per prompt (no groups needed).

Old log-probs (`algo.old_logp = "auto"`): the sampler's in float32; recomputed by the
trainer when the model computes in bf16/fp16, where the sampler's decode rounds
differently and the ratio would start away from 1 (`training.plan.resolve_old_logp`).

Run:
  python -m launch.train --config=configs/ppo.py --workdir=/tmp/ppo
  python -m launch.train --config=configs/ppo.py:runlocal --workdir=/tmp/ppo_local  # CPU
Hardware: as configs/grpo.py, plus a value model the size of the policy backbone.
Expected result: measured on the demo's task, not with a real model (no weights on
this machine): `--config=configs/arithmetic.py:preset=ppo` (100 steps, seed 0, 2 CPU
cores, 471 s while sharing them with other work, 275 s on idle cores) took held-out greedy
accuracy from 0.637 to 0.895 at step 20 and 0.879 at step 100; README's "Recipes side by side" has every preset. The default
tiny random model is for smoke runs.
"""
from jaxrl_llm.config import make_preset


def get_config(arg=None):
  return make_preset(arg, {
      "sampling.num_samples": 1,
      "train.prompts_per_step": 128,  # same B = P·G as the group presets
      "algo.advantage.estimator": "gae",
      "algo.advantage.gamma": 1.0,
      "algo.advantage.lam": 0.95,
      "algo.advantage.whiten": True,
      "algo.loss.aggregation": "token_mean",
      "algo.loss.ratio": "token",
      "algo.loss.trust_region": "clip",
      "algo.loss.clip_low": 0.2,
      "algo.loss.clip_high": 0.2,
      "algo.value.coef": 0.1,
      "algo.value.value_clip": 0.2,
      "algo.kl.coef": 0.05,
      "algo.kl.estimator": "k1",
      "algo.kl.placement": "reward",
      "algo.num_iterations": 4,
  }, local={"sampling.num_samples": 1, "train.prompts_per_step": 8,
            "algo.num_iterations": 2})
