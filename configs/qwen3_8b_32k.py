r"""Long reasoning: Qwen3-8B with 32,768 new tokens per completion on a TPU v5p-128 slice.

configs/qwen3_8b_16k.py's recipe (the long reasoning axes: clip-higher, a token-level
loss, a graded length penalty over the last 6,553 tokens, no KL term, math-verify's
reward) at twice the length: 64 prompts x G 8 = 512 completions per step, each up to
32,768 new tokens after a prompt of up to 384 (Qwen3-8B's 40,960 positions hold them).

Set-up and data as configs/qwen3_8b_16k.py. Run:
  jaxrl-llm-train --config=qwen3_8b_32k --workdir=gs://BUCKET/runs/q8_32k \
      --config.model.path=gs://BUCKET/models/Qwen3-8B \
      --config.data.source="jsonl:gs://BUCKET/data/math/{split}.jsonl"
Check it first, on any machine: python -m launch.compile --config=qwen3_8b_32k --margin=0.1
Hardware: tpu_v5p_128 (the default), a v5p-128 slice: 64 chips of 95.74 GiB on 16 hosts.
Mesh: data 2 x fsdp 32, context 1.

XLA:TPU's peak per chip (launch.compile --margin=0.1, 2026-12-05, jax 0.10.2, libtpu
0.0.42.1; README, "Compiled for TPU"), GiB of 95.74:
  program        arguments  temporaries  resident beside  peak   roofline
  sampler           36.95       16.05           6.41      59.42   775 s
  eval sampler       5.45       18.34          37.91      61.70   261 s (not every step)
  prepare            0.96        3.48          42.41      46.85   8.74 s
  policy update      2.87       31.92          40.50      75.29   32.9 s
Resident: the samplers' KV caches 36.0 and 4.50, Adam's moments 1.91. Step roofline 817 s,
MFU bound 8.8%; 21% of HBM left at the highest peak.
Why these values, from the compiler's numbers:
- 512 completions of 33,152 positions hold a 36.0 GiB KV cache per chip over 64 chips,
  as the 16k recipe's 512 over 32: a v5p-128 is the smallest v5p slice for them.
- G 8, 64 prompts, not G 16 with 32: the evaluator keeps a cache of one row per prompt,
  and 32 rows do not divide the 64 batch shards, so its rows split over the data axis
  alone: 72.0 GiB a chip, every program over HBM (peaks 114 to 143 GiB). 64 prompts put
  one row on each chip (4.50 GiB).
- The update at one row per chip (micro-batch 64) holds 31.9 GiB of temporaries and peaks
  at 75.3 GiB: it fits without the context axis (context 2 in place of data 2 lowers the
  update's peak at the same step roofline, bench/long_context.py: the setting to take if a
  longer prompt or a larger batch no longer fits). Decoding is 95% of the step.
Expected result: not measured (no accelerator and no Qwen3-8B weights here).
"""
from jaxrl_llm import config as config_lib

LONG = config_lib.presets.load_module("qwen3_8b_16k")
NEW_TOKENS = 32_768
HARDWARE = ("tpu_v5p_128",)


def get_config(arg=None):
  arg, config = LONG.recipe(arg, HARDWARE, LONG.QWEN3_8B, NEW_TOKENS)
  if arg.runlocal:  # a tiny Qwen3 from the arch, for a CPU
    return config
  t = config.train
  config.mesh.update(data=-1, fsdp=32, expert=1, context=1, tensor=1, topology="v5p:4x4x4")
  config.sampling.num_samples = 8
  t.prompts_per_step, t.micro_batch_size, t.logprob_chunk_size = 64, 64, 256
  LONG.DENSE.schedule(config)
  return config
