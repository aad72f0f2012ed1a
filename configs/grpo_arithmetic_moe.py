"""`make demo`'s GRPO on an MoE model: configs/grpo_arithmetic.py from the shipped MoE warm
start, with routing replay.

Starts from `jaxrl_llm/assets/arithmetic_moe_sft` (made by configs/sft_arithmetic_moe.py:
the dense warm start's model with every MLP replaced by 8 experts, 4 per token, trained on
the same sloppy teacher). The sampler records the experts of every token, and the
old-log-prob pass and the update route as it did (`config.algo.routing_replay =
'rollout'`; `moe/routing_mismatch` logs how often the update's own router would have
chosen otherwise, 0 here by construction).

Run: (2 CPU cores)
  JAX_PLATFORMS=cpu python -m launch.train --config=configs/grpo_arithmetic_moe.py \
      --workdir=/tmp/grpo_arith_moe
  # from a warm start of your own (configs/sft_arithmetic_moe.py's DIR/export):
  JAX_PLATFORMS=cpu python -m launch.train \
      --config=configs/grpo_arithmetic_moe.py:warm_start=/tmp/sft_arith_moe/export \
      --workdir=/tmp/grpo_arith_moe
Expected result: README, "Mixture-of-experts models" (`make figures` regenerates it).
"""
from jaxrl_llm import assets
from jaxrl_llm import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=200, runlocal=False, warm_start="")
  arithmetic = config_lib.presets.load_module("arithmetic")
  config = arithmetic.apply(config_lib.preset("grpo"), arg.steps, arg.runlocal)
  config.model.path = arg.warm_start or assets.path("arithmetic_moe_sft")
  config.algo.routing_replay = "rollout"
  return config
