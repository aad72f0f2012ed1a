r"""GRPO on GSM8K with Qwen3-32B on a TPU v5p-128 slice, the sampler on the same chips or
on chips of its own.

configs/qwen3_gsm8k.py's recipe (the GRPO axes, Qwen3's chat template, the GSM8K rewards,
bf16 compute over float32 master weights, full remat) at 32B: 64 layers, hidden 5120, MLP
25600, 64 query and 8 KV heads of 128, vocab 151,936, untied: 32.8B parameters. 1,024
new tokens, 256 prompts x G 8 per step.

Set-up as configs/qwen3_gsm8k.py (hf download Qwen/Qwen3-32B). Run: the model and the
data are yours to name:
  jaxrl-llm-train --config=qwen3_32b_gsm8k --workdir=gs://BUCKET/runs/q32 \
      --config.model.path=gs://BUCKET/models/Qwen3-32B \
      --config.data.source="jsonl:gs://BUCKET/data/gsm8k/{split}.jsonl"
Check it first, on any machine: python -m launch.compile --config=qwen3_32b_gsm8k
Hardware: a v5p-128 slice, 64 chips of 95 GiB on 16 hosts. tpu_v5p_128 (the default)
shares every chip between the sampler and the trainer (fsdp 16 x tensor 4); split gives
the sampler 32 chips of its own (`mesh.rollout_devices`) and the trainer the other 32
(fsdp 8 x tensor 4), sampling one step ahead (`algo.max_async_level=1`) so that the two
overlap.
XLA:TPU's peak per chip of 95.74 GiB (launch.compile, 2026-12-03; README, "Compiled for
TPU"), GiB:
  variant       sampler  eval  prepare  update  step roofline, MFU bound
  tpu_v5p_128     46.8   43.7    17.4    29.6   49.4 s, 74.6%
  split           67.2   34.3    18.7    42.5   71.6 s, 51.5% (the two halves overlapped)
Shared placement is the faster by its roofline: decode is bound by HBM bandwidth, and
sharing gives it all 64 chips'.
Expected result: not measured (no accelerator and no Qwen3-32B weights here).
"""
from jaxrl_llm import config as config_lib

DENSE = config_lib.presets.load_module("qwen3_gsm8k")
HARDWARE = ("tpu_v5p_128", "split")
# Qwen/Qwen3-32B config.json.
QWEN3_32B = dict(hidden_size=5120, intermediate_size=25600, num_layers=64, num_heads=64,
                 num_kv_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False)


def get_config(arg=None):
  arg, config = DENSE.larger(arg, HARDWARE, QWEN3_32B)
  if arg.runlocal:  # a tiny Qwen3 from the arch, for a CPU
    return config
  config.mesh.update(data=-1, fsdp=16, expert=1, tensor=4, topology="v5p:4x4x4")
  if arg.split:
    config.mesh.update(fsdp=8, rollout_devices=32)
    config.algo.max_async_level = 1
  t = config.train
  t.prompts_per_step, t.micro_batch_size, t.logprob_chunk_size = 256, 64, 256
  DENSE.schedule(config)
  config.sampling.max_new_tokens = 1024
  return config
