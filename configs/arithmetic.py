"""Any RL preset on the demo's task, to compare recipes on a CPU in minutes.

The presets (grpo.py, ppo.py, ...) default to a tiny random model, for smoke runs. This
file puts one of them on `make demo`'s setting, where learning shows within minutes:
the shipped warm start (`jaxrl_llm/assets/arithmetic_sft`, a small Llama that imitated
a teacher who forgets carries), `a+b=` / `a-b=` problems, exact-match reward plus 0.1
for the format, 512 sampled rows per step (P = 512 / G, each preset keeping its own G),
AdamW lr 1e-4, held-out greedy accuracy on 256 problems every 20 steps. Only the
preset's algorithm axes differ between runs.

Run:
  python -m launch.train --config=configs/arithmetic.py:preset=dapo --workdir=/tmp/dapo_arith
  python -m launch.train --config=configs/arithmetic.py:preset=ppo,steps=50 --workdir=/tmp/ppo
  python -m launch.train --config=configs/arithmetic.py:preset=gspo,runlocal --workdir=/tmp/g
  python bench/recipes.py     # every preset, one after another, and the table below
Hardware: 2 CPU cores; 100 steps take about a minute (PPO, with its value model, four
passes per batch and 512 prompts of one sample each, about 7 minutes).
Expected result (measured, seed 0, 100 steps; also in README's "Recipes side by side"):
held-out greedy accuracy 0.637 at step 0 for every preset, then at steps 20 and 100:
grpo 0.836 / 0.910, dr_grpo 0.855 / 0.902, dapo 0.883 / 0.930, gspo 0.871 / 0.898,
gmpo 0.844 / 0.898, cispo 0.867 / 0.910, sapo 0.844 / 0.898, rloo 0.863 / 0.922,
reinforce_pp 0.859 / 0.906, max_rl 0.859 / 0.918, ppo 0.895 / 0.898.
"""
import importlib

from configs import common
from configs import sft_arithmetic
from jaxrl_llm import assets

# The RL presets this file accepts (sft is supervised: see sft_arithmetic.py).
PRESETS = ("grpo", "dr_grpo", "dapo", "gspo", "gmpo", "cispo", "sapo", "rloo", "reinforce_pp",
           "max_rl", "ppo")
ROWS_PER_STEP = 512  # B = P * G sampled completions per step


def apply(config, steps: int, runlocal: bool = False):
  """Puts `config` (any preset) on the arithmetic task from the shipped warm start."""
  G = config.sampling.num_samples
  if ROWS_PER_STEP % G:
    raise ValueError(f"config.sampling.num_samples={G}: expected a divisor of {ROWS_PER_STEP}")
  config.model.path = assets.path("arithmetic_sft")
  config.data.source = "task:arithmetic"
  config.data.task_options = sft_arithmetic.TASK_OPTIONS
  config.sampling.max_new_tokens = 4  # the longest answer, '-30', plus EOS
  config.sampling.max_prompt_len = 8  # the longest prompt, '30-30=', is 6 characters
  config.sampling.prompt_buckets = (8,)
  config.train.steps = steps
  config.train.prompts_per_step = ROWS_PER_STEP // G
  config.train.micro_batch_size = 256
  config.train.eval_every = 20
  config.train.logprob_chunk_size = 4
  config.optimizer.lr = 1e-4  # GRPO: 3e-4 rises as fast, then wobbles lower (0.80-0.89)
  config.optimizer.warmup_steps = 5
  config.checkpoint.every = 100
  if runlocal:
    config.train.steps, config.train.eval_every, config.train.micro_batch_size = 2, 0, 32
    config.train.prompts_per_step = 32 // G
  return config


def get_config(arg=None):
  arg = common.parse_arg(arg, preset="grpo", steps=100, runlocal=False)
  if arg.preset not in PRESETS:
    raise ValueError(f"preset={arg.preset!r}: expected one of {', '.join(PRESETS)}")
  preset = importlib.import_module(f"configs.{arg.preset}")
  return apply(preset.get_config(), arg.steps, arg.runlocal)
