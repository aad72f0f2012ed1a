"""Any RL preset on the demo's task, to compare recipes on a CPU in minutes.

The presets (grpo.py, ppo.py, ...) default to a tiny random model, for smoke runs. This
file puts one of them on `make demo`'s setting, where learning shows within minutes:
the shipped warm start (`jaxrl_llm/assets/arithmetic_sft`, a small Llama that imitated
a teacher who forgets carries; a distillation preset's teacher (opd, mixed) is
`jaxrl_llm/assets/arithmetic_grpo`, that model after `make demo`'s 200 GRPO steps), `a+b=` / `a-b=` problems, exact-match reward plus 0.1
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
Expected result: held-out greedy accuracy 0.637 at step 0 for every preset, rising to
about 0.9 by step 100; README's "Recipes side by side" has every preset's curve, the
table `python bench/recipes.py` prints.
"""
from jaxrl_llm import assets
from jaxrl_llm import config as config_lib

# The RL presets this file accepts (sft is supervised: see sft_arithmetic.py).
PRESETS = ("grpo", "dr_grpo", "dapo", "gspo", "gmpo", "cispo", "sapo", "rloo", "reinforce_pp",
           "max_rl", "ipo", "dppo_tv", "ppo", "opd", "mixed")
ROWS_PER_STEP = 512  # B = P * G sampled completions per step
# The demo's task: two operands in [0, 30], + or -; answers from -30 to 60.
TASK_OPTIONS = dict(min_operands=2, max_operands=2, max_value=30, operators="+-", num_eval=256)


def apply(config, steps: int, runlocal: bool = False):
  """Puts `config` (any preset) on the arithmetic task from the shipped warm start."""
  G = config.sampling.num_samples
  if ROWS_PER_STEP % G:
    raise ValueError(f"config.sampling.num_samples={G}: expected a divisor of {ROWS_PER_STEP}")
  config.model.path = assets.path("arithmetic_sft")
  if config.teacher.path == config_lib.REQUIRED:  # a distillation preset (opd)
    config.teacher.path = assets.path("arithmetic_grpo")
  rewards = config_lib.schema.rewards_config()  # the schema's: the task's exact match and format
  if len(config.sources):  # a mixed preset: every source on the task
    for source in config.sources.values():
      source.data, source.task_options = "task:arithmetic", TASK_OPTIONS
      source.rewards.update(rewards)
  else:
    config.data.source = "task:arithmetic"
    config.data.task_options = TASK_OPTIONS
    config.rewards.update(rewards)  # also a preset without any (opd)
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
  arg = config_lib.parse_arg(arg, preset="grpo", steps=100, runlocal=False)
  if arg.preset not in PRESETS:
    raise ValueError(f"preset={arg.preset!r}: expected one of {', '.join(PRESETS)}")
  return apply(config_lib.preset(arg.preset), arg.steps, arg.runlocal)
