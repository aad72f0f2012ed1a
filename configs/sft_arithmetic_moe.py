"""SFT warm start of the MoE demo: configs/sft_arithmetic.py with a Mixtral-style model.

The same task, teacher, optimizer and steps as the dense warm start; the model is the
dense one's attention with every MLP replaced by 8 experts of width 96, 4 per token:
the same active parameters per token (4 x 96 = the dense MLP's 384), twice the MLP
weights (5.6 MB in float32). configs/grpo_arithmetic_moe.py then runs the demo's GRPO
from it.

Run: (this is how the shipped files were made, seed 0 = config.seed, 2 CPU cores)
  JAX_PLATFORMS=cpu python -m launch.train --config=configs/sft_arithmetic_moe.py \
      --workdir=/tmp/sft_arith_moe
  cp /tmp/sft_arith_moe/export/* jaxrl_llm/assets/arithmetic_moe_sft/
Hardware: 2 CPU cores, 15:21 (2026-12-03, the cores shared with other jobs).
Expected result (measured on the 256 held-out problems): greedy exact-match accuracy
0.078, 0.258, 0.555, 0.629, 0.645, 0.633 at steps 500 ... 3000 (the dense warm start:
0.637 at step 3000); last batch loss 0.071.
"""
from jaxrl_llm import config as config_lib

DENSE = config_lib.presets.load_module("sft_arithmetic")
# Mixtral: Llama attention, every layer's MLP a mixture of experts.
MOE_ARCH = dict(DENSE.ARCH, model_type="mixtral", num_experts=8, num_experts_per_tok=4,
                moe_intermediate_size=96)


def get_config(arg=None):
  config = DENSE.get_config(arg)
  config.model.arch.update(MOE_ARCH)
  return config
