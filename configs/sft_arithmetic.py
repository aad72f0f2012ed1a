"""SFT warm start for the demo: a small Llama learns `a+b=` from demonstrations.

Makes the checkpoint the package ships in `jaxrl_llm/assets/arithmetic_sft/` (the
starting point of `make demo`): trained from scratch, stopped early on purpose so that
RL has signal (some answers right, not most).

Run: (this is how the shipped files were made, seed 0, CPU)
  python -m launch.train --config=configs/sft_arithmetic.py --workdir=/tmp/sft_arith
  cp /tmp/sft_arith/export/* jaxrl_llm/assets/arithmetic_sft/
The preset is `sft` (configs/sft.py): advantage 1 on target tokens,
no ratio, token-mean loss = mean negative log-likelihood of the answer and its EOS.
Hardware: 2 CPU cores, about two minutes.
Expected result: held-out exact-match accuracy around 0.3 (printed every 100 steps).
"""
from configs import common
from configs import sft

# The demo's task: two operands in [0, 30], + or -; answers from -30 to 60.
TASK_OPTIONS = dict(min_operands=2, max_operands=2, max_value=30, operators="+-", num_eval=256)
# A character-level vocabulary (99 symbols) padded to 128.
ARCH = dict(model_type="llama", vocab_size=128, hidden_size=128, intermediate_size=384,
            num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10000.0,
            rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=64)


def get_config(arg=None):
  arg = common.parse_arg(arg, steps=300, runlocal=False)
  config = sft.get_config()
  config.unlock()
  config.model.arch.update(ARCH)
  config.data.source = "task:arithmetic"
  config.data.task_options = TASK_OPTIONS
  config.sampling.max_new_tokens = 4  # the longest answer, '-30', plus EOS
  config.sampling.max_prompt_len = 16
  config.sampling.prompt_buckets = (16,)
  config.train.steps = arg.steps
  config.train.prompts_per_step = 64
  config.train.micro_batch_size = 64
  config.train.eval_every = 100
  config.train.logprob_chunk_size = 4
  config.optimizer.lr = 3e-3
  config.optimizer.schedule = "cosine"
  config.optimizer.warmup_steps = 20
  config.optimizer.weight_decay = 0.01
  config.checkpoint.every = 0
  if arg.runlocal:
    config.train.steps, config.train.prompts_per_step, config.train.eval_every = 2, 8, 0
  return common.finalize(config)
