"""`make demo`: GRPO on `a+b=` arithmetic from the shipped SFT warm start, on a CPU.

Starts from `jaxrl_llm/assets/arithmetic_sft` (made by configs/sft_arithmetic.py), samples
G = 8 answers per problem, rewards exact matches (plus a small format reward), and
reports held-out exact-match accuracy every few steps.

Run:
  make demo                       # sets itself up, then runs the command below
  python -m launch.demo --workdir=workdir/demo
  python -m launch.train --config=configs/grpo_arithmetic.py --workdir=/tmp/grpo_arith
Hardware: 2 CPU cores, about 7.5 minutes.
Expected result (measured, seed 0, 500 steps): the sampled train exact-match rate rises
steadily (means over 50 steps: 0.216, 0.233, ..., 0.272), held-out greedy accuracy only
from 0.27 to 0.31, most of it in the last 150 steps. Larger learning rates (3e-4, 1e-3)
move this 0.6M-parameter model too far per Adam step and lower the accuracy instead.
TODO(issue 6): a warm start / task / recipe where held-out accuracy rises by a wide margin.
"""
from configs import common
from configs import grpo
from configs import sft_arithmetic
from jaxrl_llm import assets


def get_config(arg=None):
  arg = common.parse_arg(arg, steps=500, runlocal=False)
  config = grpo.get_config()
  config.model.path = assets.path("arithmetic_sft")
  config.data.source = "task:arithmetic"
  config.data.task_options = sft_arithmetic.TASK_OPTIONS
  config.sampling.num_samples = 8
  config.sampling.max_new_tokens = 4
  config.sampling.max_prompt_len = 16
  config.sampling.prompt_buckets = (16,)
  config.train.steps = arg.steps
  config.train.prompts_per_step = 64
  config.train.micro_batch_size = 256
  config.train.eval_every = 50
  config.train.logprob_chunk_size = 4
  config.optimizer.lr = 1e-4  # 3e-4 and up: each Adam step moves this tiny model too far
  config.optimizer.warmup_steps = 5
  config.checkpoint.every = 100
  if arg.runlocal:
    config.train.steps, config.train.prompts_per_step, config.train.eval_every = 2, 4, 0
    config.train.micro_batch_size = 32
  return config
