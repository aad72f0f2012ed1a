"""The agent demo: GRPO teaches the SFT warm start to call its calculator tool properly.

Starts from `jaxrl_llm/assets/calculator_sft` (configs/sft_calculator.py: a small Llama
that imitated a user who names the tool 'calculator' in 60% of its calls and sometimes
answers unaided), plays G = 4 episodes per problem, 16 problems per step
(`task:calculator`, products of two numbers in 10..99) against `jaxrl_llm.envs.calculator:CalculatorEnv`: the model's turn,
the tool's answer (or its error), the model's answer. The reward is exact match on the
last turn; `calculator_valid_call` (weight 0) logs the valid-call rate, and `env/...`
the episodes (turns, endings, tool-call outcomes). Held-out greedy accuracy on 128
problems every 20 steps (greedy episodes cost most of an evaluation's time).

Run:
  python -m launch.demo --task=calculator --workdir=workdir/calculator
  python -m launch.train --config=configs/grpo_calculator.py --workdir=/tmp/grpo_calc

Hardware: 2 CPU cores, 9:40 wall time for the 100 steps (2026-12-02; a step about 4.7 s).
Expected result (seed 0): held-out greedy accuracy 0.000 at step 0 (the warm start never
names the tool right), near 1 by step 100; README, "Agents", has the latest run's curve
and valid-call rate (`make figures` reruns it and rewrites them).
"""
from jaxrl_llm import assets
from jaxrl_llm import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=100, runlocal=False)
  sft_calculator = config_lib.presets.load_module("sft_calculator")
  config = config_lib.preset("grpo")
  config.unlock()
  config.model.path = assets.path("calculator_sft")
  config.model.remat = "none"
  sft_calculator.apply_task(config)
  config.data.task_options = dict(sft_calculator.TASK_OPTIONS, num_eval=128)
  config.sampling.num_samples = 4
  config.train.steps = arg.steps
  config.train.prompts_per_step = 16  # 64 episodes per step; evaluation runs 16 at a time
  config.train.micro_batch_size = 64
  config.train.eval_every = 20
  config.algo.kl.coef = 0.0  # no reference model: a step costs one forward less
  config.algo.kl.placement = "none"
  config.optimizer.lr = 3e-4
  config.optimizer.warmup_steps = 3
  config.checkpoint.every = 0
  config.logging.rollouts_every = 10
  if arg.runlocal:
    config.train.steps, config.train.eval_every, config.train.prompts_per_step = 2, 0, 2
  return config_lib.finalize(config)
