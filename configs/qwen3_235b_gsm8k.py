r"""GRPO on GSM8K with Qwen3-235B-A22B on a TPU v5p slice, expert-parallel, with routing
replay.

configs/qwen3_moe_gsm8k.py's recipe (Qwen3-30B-A3B's: the GRPO axes, Qwen3's chat
template, the GSM8K rewards, bf16 compute over float32 master weights, full remat, the
static engine recording every token's experts and the update replaying them) at 235B: 94
layers, hidden 4096, 64 query and 4 KV heads of 128, 128 experts of width 1536, 8 per
token (norm_topk_prob), vocab 151,936, untied: 235B parameters, 22B active per token.

Set-up as configs/qwen3_gsm8k.py (hf download Qwen/Qwen3-235B-A22B). Run: the model and
the data are yours to name:
  jaxrl-llm-train --config=qwen3_235b_gsm8k --workdir=gs://BUCKET/runs/q235 \
      --config.model.path=gs://BUCKET/models/Qwen3-235B-A22B \
      --config.data.source="jsonl:gs://BUCKET/data/gsm8k/{split}.jsonl"
Check it first, on any machine: python -m launch.compile --config=qwen3_235b_gsm8k
Hardware: a v5p-256 slice (tpu_v5p_256), 128 chips of 95 GiB on 32 hosts, expert 32 x
fsdp 4: each chip holds 4 of a layer's 128 experts, and the weights without an expert
dimension split their hidden dimension over every chip. It is the smallest v5p slice that
holds the run: on a v5p-128 (expert 16 x fsdp 4) the policy update needs 112.8 GiB of a
chip's 95.7 at micro-batch 128, and still 105.8 at 64 rows with 128 prompts a step
(XLA:TPU, launch.compile): the float32 state and gradients alone take most of it.
On the v5p-256, GiB per chip of 95.74 (2026-12-03): sampler 45.6, evaluator 43.3, prepare
35.5, policy update 58.2 (arguments 20.6, temporaries 30.8, the reference and KV buffers
beside it 6.7). Step roofline 191 s, MFU bound 6.7%: bound by HBM traffic, most of it the
dropless expert buffers, each chip sorting and gathering every one of its 32 source chips'
assignments, 1/32 of them its own.
Expected result: not measured (no accelerator and no Qwen3-235B weights here).
"""
from jaxrl_llm import config as config_lib

MOE = config_lib.presets.load_module("qwen3_moe_gsm8k")
HARDWARE = ("tpu_v5p_256",)
# Qwen/Qwen3-235B-A22B config.json.
QWEN3_235B_A22B = dict(hidden_size=4096, intermediate_size=12288, num_layers=94,
                       num_heads=64, num_kv_heads=4, head_dim=128, num_experts=128,
                       num_experts_per_tok=8, moe_intermediate_size=1536)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, runlocal=False, **{h: False for h in HARDWARE})
  config = MOE.get_config("runlocal" if arg.runlocal else None)
  if arg.runlocal:  # a tiny Qwen3-MoE from the arch
    return config
  config.model.arch.update(QWEN3_235B_A22B)
  config.mesh.update(data=1, fsdp=4, expert=32, tensor=1, topology="v5p:4x4x8")
  MOE.shard_embed_over_experts(config)
  t = config.train
  t.prompts_per_step, t.micro_batch_size, t.logprob_chunk_size = 256, 128, 256
  MOE.DENSE.schedule(config)
  return config
