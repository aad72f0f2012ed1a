"""`make demo`: GRPO on `a+b=` arithmetic from the shipped SFT warm start, on a CPU.

Starts from `jaxrl_llm/assets/arithmetic_sft` (made by configs/sft_arithmetic.py), samples
G = 8 answers per problem, rewards exact matches (plus a small format reward), and
reports held-out exact-match accuracy every few steps.

Run:
  make demo                       # sets itself up, then runs the command below
  python -m launch.demo --workdir=workdir/demo
  python -m launch.train --config=configs/grpo_arithmetic.py --workdir=/tmp/grpo_arith
Hardware: 2 CPU cores, under 10 minutes.
Expected result: held-out accuracy rises from the warm start's ~0.3 to 0.6 or more.
"""
from configs import common
from configs import grpo
from configs import sft_arithmetic
from jaxrl_llm import assets


def get_config(arg=None):
  arg = common.parse_arg(arg, steps=60, runlocal=False)
  config = grpo.get_config()
  config.model.path = assets.path("arithmetic_sft")
  config.data.source = "task:arithmetic"
  config.data.task_options = sft_arithmetic.TASK_OPTIONS
  config.sampling.num_samples = 8
  config.sampling.max_new_tokens = 4
  config.sampling.max_prompt_len = 16
  config.sampling.prompt_buckets = (16,)
  config.train.steps = arg.steps
  config.train.prompts_per_step = 16
  config.train.micro_batch_size = 128
  config.train.eval_every = 10
  config.train.logprob_chunk_size = 4
  config.optimizer.lr = 3e-4
  config.checkpoint.every = 20
  if arg.runlocal:
    config.train.steps, config.train.prompts_per_step, config.train.eval_every = 2, 4, 0
    config.train.micro_batch_size = 32
  return config
