r"""Long reasoning: Qwen3-30B-A3B with 16,384 new tokens per completion on a TPU v5p-64
slice, with routing replay.

configs/qwen3_moe_gsm8k.py's model, mesh and routing replay (the sampler records every
token's experts, the trainer replays them; the static engine samples) with the long
reasoning axes of configs/qwen3_8b_16k.py (`long_reasoning`: clip-higher, a token-level
loss, a graded length penalty over the last 3,276 tokens, no KL term, math-verify's
reward). 32 prompts x G 16 = 512 completions per step, each up to 16,384 new tokens.

Set-up as configs/qwen3_moe_gsm8k.py (hf download Qwen/Qwen3-30B-A3B), the data as
configs/qwen3_8b_16k.py's. Run:
  jaxrl-llm-train --config=qwen3_moe_16k --workdir=gs://BUCKET/runs/q30_16k \
      --config.model.path=gs://BUCKET/models/Qwen3-30B-A3B \
      --config.data.source="jsonl:gs://BUCKET/data/math/{split}.jsonl"
Check it first, on any machine: python -m launch.compile --config=qwen3_moe_16k --margin=0.1
Hardware: tpu_v5p_64 (the default), a v5p-64 slice: 32 chips of 95.74 GiB on 8 hosts.
Mesh: expert 8 x fsdp 4, context 1 (each chip holds 16 of a layer's 128 experts).

XLA:TPU's peak per chip (launch.compile --margin=0.1, 2026-12-05, jax 0.10.2, libtpu
0.0.42.1; README, "Compiled for TPU"), GiB of 95.74:
  program        arguments  temporaries  resident beside  peak   roofline
  sampler           28.81       17.02          11.12      57.34   430 s
  eval sampler       6.31       11.36          33.62      51.31   183 s (not every step)
  prepare            5.20       12.13          35.12      52.83   20.2 s
  policy update     14.82       34.22          25.50      74.54   61.3 s
Resident: Adam's moments 9.62, the samplers' KV caches 24.0 and 1.50. Step roofline 511 s,
MFU bound 7.2%; 22% of HBM left at the highest peak. The routing record (512 rows x 16,768
tokens x 48 layers x 8 experts, int32, 12.3 GiB) stays on the host.
Why these values, from the compiler's numbers:
- The policy update is the highest peak: one row per chip (micro-batch 32, the smallest
  the 32 batch shards allow) holds 34.2 GiB of temporaries for its 16,768 tokens a chip
  (the 8B's update holds 16.7 at the same tokens: the dropless expert buffers).
- Its KV cache is 2/3 of the 8B's a token (48 layers x 4 KV heads against 36 x 8): 24.0
  GiB a chip. Context 2 would halve the update's activations at a step roofline within 1%
  of context 1's (bench/long_context.py, for 8B); the update fits without it, so context
  stays 1.
- Decoding is 84% of the step (430 of 511 s), bound by HBM bandwidth, so the update's
  settings barely move the step.
Expected result: not measured (no accelerator and no Qwen3-MoE weights here).
"""
from jaxrl_llm import config as config_lib

LONG = config_lib.presets.load_module("qwen3_8b_16k")
MOE = config_lib.presets.load_module("qwen3_moe_gsm8k")
NEW_TOKENS = 16_384


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, runlocal=False, tpu_v5p_64=True)
  config = MOE.get_config("runlocal" if arg.runlocal else "tpu_v5p_64")
  LONG.long_reasoning(config, config.sampling.max_new_tokens if arg.runlocal else NEW_TOKENS)
  if arg.runlocal:  # a tiny Qwen3-MoE from the arch, for a CPU
    config.sampling.num_samples = 4
    return config
  t = config.train
  config.mesh.update(data=1, fsdp=4, expert=8, context=1, tensor=1, topology="v5p:4x4x2")
  t.prompts_per_step, t.micro_batch_size, t.logprob_chunk_size = 32, 32, 256
  LONG.DENSE.schedule(config)
  return config
