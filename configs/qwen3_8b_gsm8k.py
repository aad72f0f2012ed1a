r"""GRPO on GSM8K with Qwen3-8B on a TPU v5p-32 slice (one slice, or two over the
data-center network).

configs/qwen3_gsm8k.py's recipe (the GRPO axes, Qwen3's chat template, the GSM8K rewards,
bf16 compute over float32 master weights, full remat) at 8B: 36 layers, hidden 4096, MLP
12288, 32 query and 8 KV heads of 128, vocab 151,936, untied: 8.2B parameters. 1,024
new tokens (Qwen3 reasons at length), 128 prompts x G 8 per step.

Set-up as configs/qwen3_gsm8k.py (hf download Qwen/Qwen3-8B). Run: the model and the data
are yours to name:
  jaxrl-llm-train --config=qwen3_8b_gsm8k --workdir=gs://BUCKET/runs/q8 \
      --config.model.path=gs://BUCKET/models/Qwen3-8B \
      --config.data.source="jsonl:gs://BUCKET/data/gsm8k/{split}.jsonl"
Check it first, on any machine (XLA:TPU compiles every program for the slice; README,
"Compiled for TPU"): python -m launch.compile --config=qwen3_8b_gsm8k
Hardware: tpu_v5p_32 (the default) is a v5p-32 slice, 16 chips of 95 GiB on 4 hosts;
tpu_v5p_32x2 two such slices joined by the data-center network (multislice: the data
axis spans the slices, every other axis stays on a slice's own links). Mesh: fsdp 16 on
one slice (data 2 x fsdp 16 on two).
XLA:TPU's peak per chip (launch.compile, 2026-12-03; README, "Compiled for TPU"), GiB:
  variant        slice            sampler  prepare  update  HBM   step roofline, MFU bound
  tpu_v5p_32     v5p:2x2x4         33.9     19.4     29.2   95.74  29.4 s, 58.7%
  tpu_v5p_32x2   2 x v5p:2x2x4     33.9     19.1     26.3   95.74  28.0 s, 61.6%
  qlora_v5e_8    v5e:2x4            6.6      6.4     12.8   15.75  18.9 s, 53.2%
(the sampler's peak: its arguments, the policy and the KV cache, 10.9; its temporaries
17.2; Adam's moments and the reference beside it 5.9. The DCN between slices is not in
the roofline).
Expected result: not measured (no accelerator and no Qwen3-8B weights here).
"""
from jaxrl_llm import config as config_lib

DENSE = config_lib.presets.load_module("qwen3_gsm8k")
HARDWARE = ("tpu_v5p_32", "tpu_v5p_32x2", "qlora_v5e_8")
# Qwen/Qwen3-8B config.json.
QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
                num_kv_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False)


def get_config(arg=None):
  arg, config = DENSE.larger(arg, HARDWARE, QWEN3_8B)
  if arg.runlocal:  # a tiny Qwen3 from the arch, for a CPU
    return config
  t = config.train
  if arg.qlora_v5e_8:  # adapters over an int8 base, tensor-parallel over one v5e host
    config.lora.update(rank=16, alpha=32.0, targets="all", base_quant="int8")
    config.optimizer.lr = 1e-5  # adapters take a larger step (docs/lora.md)
    config.mesh.update(data=1, fsdp=1, expert=1, tensor=8, topology="v5e:2x4")
    t.prompts_per_step, t.micro_batch_size, t.logprob_chunk_size = 16, 16, 128
    config.sampling.max_new_tokens = 1024
    DENSE.schedule(config)
    return config
  slices = 2 if arg.tpu_v5p_32x2 else 1
  config.mesh.update(data=-1, fsdp=16, expert=1, tensor=1, topology="v5p:2x2x4",
                     num_slices=slices)
  t.prompts_per_step, t.micro_batch_size, t.logprob_chunk_size = 128 * slices, 64, 256
  config.sampling.max_new_tokens = 1024
  DENSE.schedule(config)
  return config
