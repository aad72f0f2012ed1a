"""SFT warm start for the agent demo: a small Llama imitates a sloppy calculator user.

Makes the checkpoint the package ships in `jaxrl_llm/assets/calculator_sft/` (the start
of `python -m launch.demo --task=calculator`, configs/grpo_calculator.py), trained from
scratch on multi-turn demonstrations of `task:calculator` (products of two numbers in
10..99) with the calculator tool (`jaxrl_llm.envs.calculator:CalculatorEnv`). The teacher
(jaxrl_llm/tasks/calculator.py) answers 15% of the problems at once, without the tool, and
names the tool 'calculator' (unknown: the error comes back, then it answers unaided) in 60%
of its calls. The loss is on the model's turns only: the tool's messages are read, not
imitated (the loss mask of an episode). A model that imitates it calls a tool first, but
which name it writes is the teacher's coin flip: greedy, it takes the likelier one.

Run: (this is how the shipped files were made, seed 0, 2 CPU cores)
  JAX_PLATFORMS=cpu python -m launch.train --config=configs/sft_calculator.py \\
      --workdir=/tmp/sft_calc
  cp /tmp/sft_calc/export/* jaxrl_llm/assets/calculator_sft/
The tokenizer is the character tokenizer with `envs.CHAR_TOOL_NAMES_TEMPLATE`
(`jaxrl_llm/assets/char_tools_tokenizer`: the tools by name only, which keeps the
prompt short); the export carries it.
Hardware: 2 CPU cores, 36 minutes (measured while other jobs shared the cores; a step
about 1.2 s alone).
Expected result (measured, seed 0): batch loss 0.24, 0.19, 0.11, 0.085, 0.078, 0.095 at
steps 250 ... 1500 (the floor is the teacher's coin flips). The shipped model, greedy on
the 128 held-out problems of configs/grpo_calculator.py: accuracy 0.000, valid-call rate
0.000 (every call names 'calculator'); sampled at temperature 1 it calls `calc` and
copies the expression and the result right about a third of the time. (This run's own
evaluations read 0.000 too, with turns cut at 80 tokens: a call to 'calculator' is 84.)
"""
from jaxrl_llm import assets
from jaxrl_llm import config as config_lib
from jaxrl_llm.tasks import calculator

# Held-out problems, and the sloppy teacher (jaxrl_llm/tasks/calculator.py).
TASK_OPTIONS = dict(num_eval=256)
TEACHER = dict(teacher_skip_tool=0.15, teacher_wrong_name=0.6)
# Small, so that an RL step on 64 episodes of ~130 tokens takes about 2 s on 2 CPU cores.
ARCH = dict(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=256,
            num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
            rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=256)


def apply_task(config):
  """The calculator task's data, environment and lengths (shared with grpo_calculator.py)."""
  config.data.source = "task:calculator"
  config.data.env = calculator.ENV
  config.data.max_turns = 3
  # The longest episode, an unknown tool's error and an unaided answer, is about 185 tokens.
  config.data.max_episode_tokens = 192
  config.rewards.functions = calculator.TASK.reward_functions
  config.rewards.weights = calculator.TASK.reward_weights
  # A call to calc is 78 tokens with its end-of-turn token, one to "calculator" 84.
  config.sampling.max_new_tokens = 96
  config.sampling.max_prompt_len = 40  # the opening 'S:Tools: calc<eos> U:47*83<eos> A:' is 34
  config.sampling.prompt_buckets = (40,)
  config.train.logprob_chunk_size = 58
  return config


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=1500, runlocal=False)
  config = config_lib.preset("sft")
  config.unlock()
  config.model.arch.update(ARCH)
  config.model.remat = "none"  # a tiny model's activations fit; recomputing them costs time
  config.model.tokenizer_path = assets.path("char_tools_tokenizer")
  apply_task(config)
  config.data.task_options = dict(TASK_OPTIONS, **TEACHER)
  config.train.steps = arg.steps
  config.train.prompts_per_step = 32
  config.train.micro_batch_size = 32
  config.train.eval_every = 250
  config.optimizer.lr = 1e-3
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_steps = 20
  config.optimizer.weight_decay = 0.01
  config.checkpoint.every = 0
  if arg.runlocal:
    config.train.steps, config.train.prompts_per_step, config.train.eval_every = 2, 8, 0
  return config_lib.finalize(config)
