"""Files the package ships (HF format + tokenizer): the demo's warm start `arithmetic_sft`, and
`arithmetic_grpo`, that model after the demo's 200 GRPO steps (the distillation presets' teacher
on the demo's task, configs/arithmetic.py); the MoE demo's warm start `arithmetic_moe_sft`
(configs/sft_arithmetic_moe.py); the agent demo's warm start `calculator_sft`
(configs/sft_calculator.py) and its tokenizer alone, `char_tools_tokenizer` (the character
tokenizer with `envs.CHAR_TOOL_NAMES_TEMPLATE`)."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
  """The directory of shipped asset `name`, e.g. `path('arithmetic_sft')`."""
  full = os.path.join(HERE, name)
  if not os.path.isdir(full):
    available = sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d))
                       and not d.startswith("_"))
    raise FileNotFoundError(f"no shipped asset {name!r}; available: {available}")
  return full
