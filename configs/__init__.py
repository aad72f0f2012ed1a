"""Presets: one experiment per file, `get_config(arg=None)` (see jaxrl_llm/config)."""

# Every TPU recipe variant; each names its slice (`config.mesh.topology`). launch.compile
# checks that each compiles and fits it (bench/tpu_recipes.py: all of them, one table).
TPU_RECIPES = ("qwen3_gsm8k:tpu_v5e_8,size=0.6b", "qwen3_gsm8k:tpu_v5e_8,size=1.7b",
               "qwen3_gsm8k:tpu_v5p_32,size=0.6b", "qwen3_gsm8k:tpu_v5p_32,size=1.7b",
               "qwen3_8b_gsm8k", "qwen3_8b_gsm8k:tpu_v5p_32x2", "qwen3_8b_gsm8k:qlora_v5e_8",
               "qwen3_32b_gsm8k", "qwen3_32b_gsm8k:split", "qwen3_moe_gsm8k", "qwen3_235b_gsm8k",
               "qwen3_8b_16k", "qwen3_8b_32k", "qwen3_moe_16k")
