"""`make demo`'s GRPO on an MoE model: configs/grpo_arithmetic.py from the MoE warm start
(configs/sft_arithmetic_moe.py), with routing replay.

The sampler records the experts of every token, and the old-log-prob pass and the update
route as it did (`config.algo.routing_replay = 'rollout'`; `moe/routing_mismatch` logs how
often the update's own router would have chosen otherwise, 0 here by construction).

Run: (2 CPU cores; the warm start first)
  JAX_PLATFORMS=cpu python -m launch.train --config=configs/sft_arithmetic_moe.py \
      --workdir=/tmp/sft_arith_moe
  JAX_PLATFORMS=cpu python -m launch.train \
      --config=configs/grpo_arithmetic_moe.py:warm_start=/tmp/sft_arith_moe/export \
      --workdir=/tmp/grpo_arith_moe
Expected result: README, "Recipes side by side" (the MoE rows).
"""
from jaxrl_llm import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=200, runlocal=False, warm_start="/tmp/sft_arith_moe/export")
  arithmetic = config_lib.presets.load_module("arithmetic")
  config = arithmetic.apply(config_lib.preset("grpo"), arg.steps, arg.runlocal)
  config.model.path = arg.warm_start
  config.algo.routing_replay = "rollout"
  return config
