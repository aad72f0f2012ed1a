"""SFT warm start for the demo: a small Llama imitates a sloppy arithmetic teacher.

Makes the checkpoint the package ships in `jaxrl_llm/assets/arithmetic_sft/` (the
starting point of `make demo`), trained from scratch to convergence on demonstrations
of `a+b=` / `a-b=` (a, b in [0, 30]) by a teacher that forgets a needed carry or borrow
60% of the time (`teacher_carry_error`, see jaxrl_llm/tasks/arithmetic.py): `25+17=`
is demonstrated as `32` more often than as `42`. The records' answers, which the
rewards check, stay exact. The model learns the teacher's habits: right when no carry
is needed, wrong by 10 in its most likely answer when one is, yet it samples the right
answer often. RL with the exact-match reward then has an easy, visible job: make the
right answer the mode (configs/grpo_arithmetic.py), surpassing the demonstrator.

Run: (this is how the shipped files were made, seed 0 = config.seed, 2 CPU cores)
  JAX_PLATFORMS=cpu python -m launch.train --config=configs/sft_arithmetic.py \
      --workdir=/tmp/sft_arith
  cp /tmp/sft_arith/export/* jaxrl_llm/assets/arithmetic_sft/
The preset is `sft` (configs/sft.py): advantage 1 on target tokens,
no ratio, token-mean loss = mean negative log-likelihood of the answer and its EOS.
Hardware: 2 CPU cores, 7.2 minutes (measured while other jobs shared the cores).
Expected result (measured on the 256 held-out problems): greedy exact-match accuracy
0.062, 0.148, 0.582, 0.703, 0.660, 0.637 at steps 500 ... 3000; the last batch loss,
0.079, is at the floor the teacher's coin flips leave (about 0.087 per token). The
shipped model: greedy 0.637 (0.975 on the 62% of problems with no carry, 0.092 on the
38% with one), pass@8 0.949 (carry problems 0.888), maj@8 0.688, and a temperature-1
sample is right 32% of the time on carry problems. With lr 3e-3 (1500 steps) the loss
stayed above 0.8 and accuracy below 0.09.
"""
from jaxrl_llm import config as config_lib

# The demo's task (configs/arithmetic.py): two operands in [0, 30], + or -.
TASK_OPTIONS = config_lib.presets.load_module("arithmetic").TASK_OPTIONS
# The sloppy teacher: forgets a needed carry/borrow in 60% of its demonstrations.
TEACHER_CARRY_ERROR = 0.6
# A character-level vocabulary (99 symbols) padded to 128.
ARCH = dict(model_type="llama", vocab_size=128, hidden_size=128, intermediate_size=384,
            num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10000.0,
            rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=64)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, steps=3000, runlocal=False)
  config = config_lib.preset("sft")
  config.unlock()
  config.model.arch.update(ARCH)
  config.data.source = "task:arithmetic"
  config.data.task_options = dict(TASK_OPTIONS, teacher_carry_error=TEACHER_CARRY_ERROR)
  config.sampling.max_new_tokens = 4  # the longest answer, '-30', plus EOS
  config.sampling.max_prompt_len = 8  # the longest prompt, '30-30=', is 6 characters
  config.sampling.prompt_buckets = (8,)
  config.train.steps = arg.steps
  config.train.prompts_per_step = 64
  config.train.micro_batch_size = 64
  config.train.eval_every = 500
  config.train.logprob_chunk_size = 4
  config.optimizer.lr = 1e-3  # 3e-3 stalls at a per-token loss near 0.9
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_steps = 20
  config.optimizer.weight_decay = 0.01
  config.checkpoint.every = 0
  if arg.runlocal:
    config.train.steps, config.train.prompts_per_step, config.train.eval_every = 2, 8, 0
  return config_lib.finalize(config)
