r"""GRPO on GSM8K with Qwen3-0.6B or Qwen3-1.7B: bf16 compute, remat, the chat template.

The GRPO axes of configs/grpo.py (group-normalised advantages, token clip 0.2, k3 KL
0.04 in the loss), Qwen3's chat template around each question, reward 1 for the right
final answer (`#### N` or `\boxed{N}`) plus 0.1 for marking one, held-out greedy
accuracy on GSM8K's test split. The variants set the mesh, the batch and the
micro-batches for one hardware; the algorithm and lengths are the same on all three.

Set-up (once; nothing downloads at run time):
  hf download Qwen/Qwen3-0.6B --local-dir $HOME/models/Qwen3-0.6B   # or Qwen/Qwen3-1.7B
  python -m launch.prepare_gsm8k --tfds_data_dir=$HOME/tensorflow_datasets \
      --output_dir=$HOME/data/gsm8k
  # or --gsm8k_jsonl_dir=grade-school-math/grade_school_math/data (openai/grade-school-math)

Run: the model and the data are yours to name (local or gs://); the recipe refuses to
start without them (`config.REQUIRED`):
  jaxrl-llm-train --config=qwen3_gsm8k:tpu_v5e_8,size=0.6b --workdir=$HOME/runs/q06 \
      --config.model.path=$HOME/models/Qwen3-0.6B \
      --config.data.source="jsonl:$HOME/data/gsm8k/{split}.jsonl"
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 jaxrl-llm-train --config=qwen3_gsm8k:gpu_1,size=1.7b \
      --workdir=$HOME/runs/q17 --config.model.path=$HOME/models/Qwen3-1.7B \
      --config.data.source="jsonl:$HOME/data/gsm8k/{split}.jsonl"
  A TPU slice from an empty Google Cloud project, with both on gs://: docs/tpu.md.
  `--dry_run` checks a command (the config, the workdir, the model directory and the data)
  and prints the plan without loading the model.
Hardware: gpu_1 is one 80 GB GPU (A100/H100); tpu_v5e_8 one v5litepod-8 host (8 chips,
16 GB each; unchanged it also runs on a v5litepod-16, data=2); tpu_v5p_32 a v5p-32 slice
(16 chips of 95 GB on 4 hosts; JAX sees one device per chip). With no hardware named,
the gpu_1 values.
Expected result: not measured. This machine has no accelerator and no Qwen3 weights
(nothing downloads here), so no step of this recipe has run at these sizes. What is
tested: every variant passes `config.validate` on its device count (1, 8, 16 and a
v5e-16's 16 devices on 4 processes), the mesh divides the Qwen3 shapes it shards, and
`runlocal` trains two steps end to end on a tiny random Qwen3 checkpoint with a chat
template and GSM8K records (tests/qwen3_gsm8k_config_test.py). The memory figures
below come from compiling the programs, not from running them; please report a run.

Memory per device, from XLA's memory analysis of the compiled programs (compiled on CPU
devices standing in for the chips; nothing allocated), GiB:

  variant, size         | state | reference | KV cache | update temps | peak
  gpu_1, 0.6b           |  6.66 |      2.22 |     7.00 |        10.78 | 26.7
  gpu_1, 1.7b           | 19.23 |      6.41 |     7.00 |        22.30 | 54.9
  tpu_v5e_8, 0.6b       |  0.83 |      0.28 |     1.75 |         3.41 |  6.3
  tpu_v5e_8, 1.7b       |  2.40 |      0.80 |     1.75 |         6.29 | 11.2
  tpu_v5p_32, 0.6b      |  1.67 |      0.56 |     3.50 |         6.39 | 12.1
  tpu_v5p_32, 1.7b      |  4.81 |      1.60 |     3.50 |        11.52 | 21.4

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/train_step.py \
      --config=configs/qwen3_gsm8k.py:tpu_v5e_8,size=1.7b --set=model.path= --memory_only

(1 device for gpu_1, 16 for tpu_v5p_32). State: float32 parameters (4 B each) and Adam's
two moments (8 B), each sharded like its parameter over fsdp x tensor; reference: the
frozen float32 copy for the KL term; KV cache: the bf16 buffers the sampler keeps between
steps (28 layers x 8 KV heads x 128 x 2 x 2 B = 112 KiB per token, one slot per new token
of each of the P x G rows, split over the batch shards and tensor); update temps: the
compiled update's own (gradient accumulator, remat'd layer inputs, a log-prob chunk of
micro-batch x logprob_chunk_size x 151,936 float32 logits) for the longest prompt
bucket; peak: state, minibatch, temps, reference and cache together. An accelerator's
compiler lays temporaries out differently; please report measured figures.

GPU: JAX preallocates 75% of the GPU's memory by default (60 GB of 80); gpu_1 with 1.7B
peaks at ~55 GiB (59 GB) before the sampler's own temporaries, so raise the fraction:
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m launch.train \
      --config=configs/qwen3_gsm8k.py:gpu_1,size=1.7b --workdir=/tmp/q17
"""
from jaxrl_llm import config as config_lib

SIZES = ("0.6b", "1.7b")
HARDWARE = ("gpu_1", "tpu_v5e_8", "tpu_v5p_32")
# Qwen3's config.json shapes (huggingface.co/Qwen/Qwen3-0.6B, -1.7B): the memory arithmetic
# above, and what the mesh must divide (tests). Both tie the unembedding to the embedding.
QWEN3 = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                 num_kv_heads=8, head_dim=128, vocab_size=151936),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
                 num_kv_heads=8, head_dim=128, vocab_size=151936),
}
TRAIN_PROMPTS = 16_000  # ~2 epochs of GSM8K's 7,473 training problems, on every hardware


def _hardware(config, hardware: str, size: str) -> None:
  """Mesh, batch and micro-batches for one machine (rows = prompts_per_step x G = 8)."""
  mesh, train = config.mesh, config.train
  if hardware == "gpu_1":
    # One 80 GB GPU: 55 GiB at the update's peak for 1.7B (27 GiB for 0.6B); 1.7B needs
    # XLA_PYTHON_CLIENT_MEM_FRACTION above JAX's default 0.75 (see the docstring).
    mesh.update(data=-1, fsdp=1, tensor=1)  # -1: the one device
    train.prompts_per_step, train.micro_batch_size, train.logprob_chunk_size = 16, 16, 128
  elif hardware == "tpu_v5e_8":
    # 16 GB chips. 0.6B over fsdp=8: 6.3 GiB at the peak. 1.7B over fsdp=4 x tensor=2:
    # 11.2 GiB (tensor also splits the KV heads and the gathered decode weights); fsdp=8
    # alone would gather every layer's whole weights on each chip. data=-1 takes the rest
    # (2 on a v5litepod-16).
    mesh.update(data=-1, fsdp=8 if size == "0.6b" else 4, tensor=1 if size == "0.6b" else 2,
                topology="v5e:2x4")
    train.prompts_per_step, train.micro_batch_size, train.logprob_chunk_size = 32, 32, 128
  else:  # tpu_v5p_32: 16 chips of 95 GB
    # fsdp=4 within a host, data=4 across hosts: 1.7B peaks at 21 GiB of 95 with 128-row
    # micro-batches (8 per chip) and 256-position log-prob chunks.
    mesh.update(data=-1, fsdp=4, tensor=1, topology="v5p:2x2x4")
    train.prompts_per_step, train.micro_batch_size, train.logprob_chunk_size = 128, 128, 256
  schedule(config)


def schedule(config) -> None:
  """Steps for `TRAIN_PROMPTS` prompts, ten evaluations and checkpoints (after the batch
  is set): the same data on every hardware and size."""
  train = config.train
  train.steps = TRAIN_PROMPTS // train.prompts_per_step
  train.eval_every = train.steps // 10
  config.checkpoint.every = train.eval_every


def larger(arg, hardware: tuple[str, ...], arch: dict):
  """(the parsed `arg` with the variants `hardware`, the config): this recipe's v5p-32
  variant with a larger Qwen3's `arch` (the other recipes of its family set their slice,
  batch and lengths); with `runlocal`, the tiny local config as it is."""
  arg = config_lib.parse_arg(arg, runlocal=False, **{h: False for h in hardware})
  config = get_config("runlocal" if arg.runlocal else "tpu_v5p_32")
  if not arg.runlocal:
    config.model.arch.update(arch)
  return arg, config


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, size="0.6b", runlocal=False, **{h: False for h in HARDWARE})
  if arg.size not in SIZES:
    raise ValueError(f"size={arg.size!r}: expected one of {', '.join(SIZES)}")
  chosen = [h for h in HARDWARE if arg[h]]
  if len(chosen) > 1:
    raise ValueError(f"{' and '.join(chosen)}: expected at most one of {', '.join(HARDWARE)}")
  config = config_lib.preset("grpo")  # the GRPO axes, unchanged

  m = config.model
  m.path = config_lib.REQUIRED  # Qwen3-0.6B or -1.7B, a local HF directory or gs://
  m.dtype, m.param_dtype = "bfloat16", "float32"  # bf16 compute, float32 master weights
  m.remat = "full"  # keep each layer's input only: activations are rows x 896 x D per layer
  # Read only when model.path is '': a random Qwen3-shaped model (timing without weights;
  # then also set data.chat_template=False, the built-in tokenizer has no template).
  m.arch.update(model_type="qwen3", rope_theta=1e6, tie_word_embeddings=True,
                max_position_embeddings=40960, **QWEN3[arg.size])

  s = config.sampling
  s.num_samples = 8  # G
  s.max_new_tokens = 512  # reasoning + '#### N'; longer answers score 0 (truncated)
  # A GSM8K question is a few sentences; with the instruction and the template well under
  # 384 tokens (not counted with Qwen's tokenizer here; prompt_overflow='error' names any).
  s.max_prompt_len = 384
  s.prompt_buckets = (128, 256, 384)
  s.temperature = 1.0

  d = config.data
  d.source = config_lib.REQUIRED  # 'jsonl:DIR/{split}.jsonl': launch/prepare_gsm8k.py writes DIR
  d.chat_template = True  # the question as one user turn of Qwen3's template

  config.rewards.functions = ("jaxrl_llm.rewards.gsm8k:gsm8k_exact",
                              "jaxrl_llm.rewards.gsm8k:gsm8k_format")
  config.rewards.weights = (1.0, 0.1)
  config.optimizer.lr = 1e-6  # as verl's GSM8K GRPO example and TRL's GRPO default

  _hardware(config, next(iter(chosen), "gpu_1"), arg.size)
  if arg.runlocal:
    config_lib.shrink_for_local(config)
    s.max_prompt_len, s.prompt_buckets = 384, (384,)  # whole GSM8K prompts, one compile
  return config_lib.finalize(config)
