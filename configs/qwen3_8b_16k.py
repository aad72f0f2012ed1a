r"""Long reasoning: Qwen3-8B with 16,384 new tokens per completion on a TPU v5p-64 slice.

configs/qwen3_gsm8k.py's recipe (Qwen3's chat template, bf16 compute over float32 master
weights, full remat) at Qwen3-8B's shapes (configs/qwen3_8b_gsm8k.py) with the axes long
reasoning runs use (DAPO, configs/dapo.py; `long_reasoning` below): clip-higher, a
token-level loss, a graded length penalty over the last 3,276 tokens, no KL term and no
reference model, math-verify's reward. 32 prompts x G 16 = 512 completions per step, each
up to 16,384 new tokens after a prompt of up to 384.

Set-up as configs/qwen3_gsm8k.py (hf download Qwen/Qwen3-8B); the data: any math set as
jsonl records {"prompt", "answer"} (e.g. DAPO-Math-17k or MATH, converted), the answer a
final answer math-verify parses. Run:
  jaxrl-llm-train --config=qwen3_8b_16k --workdir=gs://BUCKET/runs/q8_16k \
      --config.model.path=gs://BUCKET/models/Qwen3-8B \
      --config.data.source="jsonl:gs://BUCKET/data/math/{split}.jsonl"
Check it first, on any machine: python -m launch.compile --config=qwen3_8b_16k --margin=0.1
Hardware: tpu_v5p_64 (the default), a v5p-64 slice: 32 chips of 95.74 GiB on 8 hosts.
Mesh: data 2 x fsdp 16, context 1.

XLA:TPU's peak per chip (launch.compile --margin=0.1, 2026-12-05, jax 0.10.2, libtpu
0.0.42.1; README, "Compiled for TPU"), GiB of 95.74:
  program        arguments  temporaries  resident beside  peak   roofline
  sampler           37.91       16.80           6.06      60.77   390 s
  eval sampler       4.16       19.11          39.81      63.08   111 s (not every step)
  prepare            1.91        2.56          42.06      46.54   8.83 s
  policy update      5.73       19.12          38.25      63.10   33.2 s
Resident: the samplers' KV caches 36.0 and 2.25, Adam's moments 3.81. Step roofline 432 s,
MFU bound 13.5%; 34% of HBM left at the highest peak.
Why these values, from the compiler's numbers:
- The sampler's KV cache (512 rows x 16,768 positions, 144 KiB a token) is the largest
  buffer: 36.0 GiB per chip over 32 chips, beside the bf16 weights each chip gathers for
  decoding (most of the sampler's 16.8 GiB of temporaries). On a v5p-32 the cache alone
  would be 72 GiB a chip, so v5p-64 is the smallest v5p slice for 512 completions.
- Decoding is 90% of the step (390 of 432 s, bound by HBM bandwidth: every step reads the
  cache and the weights), so the update's micro-batch barely moves the step: one row per
  chip (micro-batch 32) keeps the update's temporaries at 19.1 GiB.
- data 2 x fsdp 16, not fsdp 32: with fsdp over all 32 chips XLA:TPU compiles the
  projections as windowed einsums (loops over the weight shards adding each partial
  product into the whole output): prepare 16.3 s and the update 40.3 s by the roofline
  (45.0 and 111.5 TB of HBM traffic a chip), against 8.83 and 33.2 s here (8.5 and 33.1
  TB), for 5.7 GiB more of weights and moments a chip (step 447 s against 432).
- Context 1: the update fits at one row per chip, and context 2 in place of data 2 gives
  the same step roofline (bench/long_context.py: within 1% at every length up to 32k; it
  lowers the update's peak, which this length does not need).
- Prompts a multiple of the 32 batch shards: the evaluator's cache (one row per prompt)
  then splits over every chip (2.25 GiB); fewer prompts than shards leave its rows on
  fewer chips (configs/qwen3_8b_32k.py).
Expected result: not measured (no accelerator and no Qwen3-8B weights here).
"""
from jaxrl_llm import config as config_lib

DENSE = config_lib.presets.load_module("qwen3_gsm8k")
QWEN3_8B = config_lib.presets.load_module("qwen3_8b_gsm8k").QWEN3_8B
NEW_TOKENS = 16_384
HARDWARE = ("tpu_v5p_64",)


def long_reasoning(config, new_tokens: int) -> None:
  """DAPO's axes for long completions (configs/dapo.py; Yu et al. 2025) on top of
  configs/qwen3_gsm8k.py's recipe: clip-higher (0.2, 0.28), every token of the batch
  weighing the same (`token_mean`, so a 16k-token answer is not averaged down to a short
  one's weight), a graded length penalty over the last fifth of `new_tokens`, no KL term
  (no reference model: its forward over every long row is the prepare program's second
  largest cost), and math-verify's reward on any math data set's `answer`."""
  a = config.algo
  a.loss.aggregation = "token_mean"
  a.loss.clip_low, a.loss.clip_high = 0.2, 0.28
  a.kl.coef, a.kl.placement = 0.0, "none"
  a.overlong.update(enabled=True, cache_len=new_tokens // 5, mask_truncated=False)
  config.rewards.functions = ("jaxrl_llm.rewards.math:math_verify",)
  config.rewards.weights = (1.0,)
  config.sampling.max_new_tokens = new_tokens
  config.sampling.num_samples = 16  # G: DAPO's 16 answers per prompt


def recipe(arg, hardware: tuple[str, ...], arch: dict, new_tokens: int):
  """(the parsed `arg`, the config): configs/qwen3_gsm8k.py's recipe at `arch` with the long
  reasoning axes and `new_tokens`; with `runlocal`, the tiny local config (its 16 new
  tokens, a fifth of them the overlong penalty's)."""
  arg, config = DENSE.larger(arg, hardware, arch)
  if arg.runlocal:
    long_reasoning(config, config.sampling.max_new_tokens)
    config.sampling.num_samples = 4
  else:
    long_reasoning(config, new_tokens)
  return arg, config


def get_config(arg=None):
  arg, config = recipe(arg, HARDWARE, QWEN3_8B, NEW_TOKENS)
  if arg.runlocal:  # a tiny Qwen3 from the arch, for a CPU
    return config
  t = config.train
  config.mesh.update(data=-1, fsdp=16, expert=1, context=1, tensor=1, topology="v5p:4x4x2")
  t.prompts_per_step, t.micro_batch_size, t.logprob_chunk_size = 32, 32, 256
  DENSE.schedule(config)
  return config
