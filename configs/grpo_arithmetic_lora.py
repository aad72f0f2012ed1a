"""GRPO with LoRA on the demo's task: `make demo`'s run, training rank-16 adapters only.

The same run as configs/grpo_arithmetic.py (the shipped SFT warm start, G = 8, 200 steps,
held-out greedy accuracy every 20 steps) with `config.lora`: adapters of rank 16 (alpha 32)
on every projection (q/k/v, o, gate/up, down), the base frozen and, with the adapters off,
the reference. LoRA takes a larger learning rate than full fine-tuning (1e-3 against 1e-4):
the adapters start at zero and are a small part of the weights.

Run:
  python -m launch.train --config=configs/grpo_arithmetic_lora.py --workdir=/tmp/grpo_lora
  # QLoRA: --config.lora.base_quant=int8
Hardware: 2 CPU cores, a few minutes.
Expected result: see README's recipes table (measured, seed 0).
Writes DIR/adapter/ (PEFT's format, for peft.PeftModel.from_pretrained onto the warm
start) and DIR/export/ (the warm start with the adapters merged).
"""
from jaxrl_llm import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=200, runlocal=False)
  arithmetic = config_lib.presets.load_module("arithmetic")
  config = arithmetic.apply(config_lib.preset("grpo"), arg.steps, arg.runlocal)
  config.lora.rank = 16
  config.lora.alpha = 32.0
  config.lora.targets = "all"
  config.optimizer.lr = 1e-3
  return config
