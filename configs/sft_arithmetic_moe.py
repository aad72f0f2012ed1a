"""SFT warm start of the MoE demo: configs/sft_arithmetic.py with a Mixtral-style model.

The same task, teacher, optimizer and steps as the dense warm start; the model is the
dense one's attention with every MLP replaced by 8 experts of width 192, 2 per token:
the same active parameters per token (2 x 192 = the dense MLP's 384), 3.2x the MLP
weights. configs/grpo_arithmetic_moe.py then runs the demo's GRPO from it.

Run: (2 CPU cores)
  JAX_PLATFORMS=cpu python -m launch.train --config=configs/sft_arithmetic_moe.py \
      --workdir=/tmp/sft_arith_moe
Expected result: README, "Recipes side by side" (the MoE rows).
"""
from jaxrl_llm import config as config_lib

DENSE = config_lib.presets.load_module("sft_arithmetic")
# Mixtral: Llama attention, every layer's MLP a mixture of experts.
MOE_ARCH = dict(DENSE.ARCH, model_type="mixtral", num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=192)


def get_config(arg=None):
  config = DENSE.get_config(arg)
  config.model.arch.update(MOE_ARCH)
  return config
