r"""GRPO on GSM8K with Qwen3-30B-A3B on a TPU v5p-64 slice, with routing replay.

configs/qwen3_gsm8k.py's recipe (the GRPO axes, Qwen3's chat template, the GSM8K rewards,
bf16 compute over float32 master weights, full remat) on the mixture-of-experts Qwen3:
48 layers, hidden 2048, 32 query heads and 4 KV heads of 128, 128 experts of width 768,
8 per token (norm_topk_prob), vocab 151,936, untied: 30.5B parameters, 3.3B active per
token. The sampler records every token's experts and the trainer replays them
(`config.algo.routing_replay = 'rollout'`, docs/moe.md), so the static engine samples.

Set-up as configs/qwen3_gsm8k.py (hf download Qwen/Qwen3-30B-A3B). Run: the model and the
data are yours to name:
  jaxrl-llm-train --config=qwen3_moe_gsm8k:tpu_v5p_64 --workdir=gs://BUCKET/runs/q30 \
      --config.model.path=gs://BUCKET/models/Qwen3-30B-A3B \
      --config.data.source="jsonl:gs://BUCKET/data/gsm8k/{split}.jsonl"
Hardware: a v5p-64 slice, 32 chips of 95 GB on 8 hosts (one JAX device per chip). Mesh:
expert 8 x fsdp 4 (data 1): each chip holds 16 of a layer's 128 experts, a quarter of
their hidden dimension, and a quarter of everything else's.
Expected result: not measured. No accelerator and no Qwen3-MoE weights here; what is
tested (tests/qwen3_moe_config_test.py): the variant validates on 32 devices as 8 hosts,
its mesh divides the shapes it shards, and `runlocal` trains two steps end to end on a
tiny random Qwen3-MoE checkpoint.

Check it first, on any machine: python -m launch.compile --config=qwen3_moe_gsm8k
XLA:TPU compiled every program for the v5p-64 (2026-12-03, jax 0.10.2, libtpu 0.0.42.1;
README, "Compiled for TPU"), GiB per chip of 95.74:
  program        arguments  temporaries  resident beside  peak
  sampler             7.8        13.5           12.4      33.8
  eval sampler        5.2        10.3           15.0      30.6
  prepare             7.3         3.8           13.0      24.2
  policy update      14.5        22.0            5.8      42.3
Resident: Adam's moments 9.6, the bf16 reference 2.4, the samplers' KV buffers 3.0 and
0.4. The routing record (1024 rows x 1408 tokens x 48 layers x 8 experts, int32, 2.1 GiB)
stays on the host. Step roofline 33.4 s, MFU bound 11.0%: every program is bound by HBM
traffic, most of it the dropless expert buffers (every chip sorts and gathers the n x k
assignments of each of its 8 source chips, 1/8 of them its own).
"""
from jaxrl_llm import config as config_lib

DENSE = config_lib.presets.load_module("qwen3_gsm8k")
# Qwen/Qwen3-30B-A3B config.json.
QWEN3_30B_A3B = dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
                     num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
                     vocab_size=151936, tie_word_embeddings=False, num_experts=128,
                     num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True)


def shard_embed_over_experts(config) -> None:
  """The weights without an expert dimension (attention, embeddings, norms) split their
  `embed` dimension over fsdp x expert, every chip, instead of fsdp alone: an expert
  weight's expert dimension takes the expert axis first, so it stays over fsdp (a mesh
  axis shards an array once)."""
  config.mesh.rules = tuple((name, ("fsdp", "expert") if name == "embed" else axes)
                            for name, axes in config.mesh.rules)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, runlocal=False, tpu_v5p_64=True)
  config = DENSE.get_config("runlocal" if arg.runlocal else "tpu_v5p_32")
  config.model.arch.update(QWEN3_30B_A3B)
  config.algo.routing_replay = "rollout"
  config.sampling.engine = "static"  # the engine that records the experts
  if arg.runlocal:  # a tiny Qwen3-MoE from the arch
    config.model.arch.update(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=16, vocab_size=512, num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=32)
    return config
  config.mesh.update(data=1, fsdp=4, expert=8, tensor=1, topology="v5p:4x4x2")
  t = config.train
  t.prompts_per_step, t.micro_batch_size, t.logprob_chunk_size = 128, 128, 256
  DENSE.schedule(config)
  config.sampling.max_new_tokens = 1024  # Qwen3 thinks at length
  config.model.router_aux_loss_coef = 0.001  # Qwen3-MoE's config.json value
  return config
