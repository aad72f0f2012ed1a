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
below come from XLA:TPU compiling the programs, not from running them; please report a run.

Memory per chip, from XLA:TPU compiling every program of a step for the variant's slice
(`python -m launch.compile --config=qwen3_gsm8k:tpu_v5e_8,size=1.7b`, on any machine with
the `tpu` extra; nothing allocated; jax 0.10.2, libtpu 0.0.42.1, 2026-12-03), GiB: the
peak of each program, its arguments and temporaries plus what stays resident beside it
(the optimizer moments, the bf16 reference, the samplers' KV buffers):

  variant, size     | chip HBM | sampler | prepare | update (args + temps) | step roofline, MFU bound
  tpu_v5e_8, 0.6b   |   15.75  |    4.2  |    3.5  |    4.9 (0.83 + 1.99)  |  6.0 s, 16.0%
  tpu_v5e_8, 1.7b   |   15.75  |    6.8  |    5.6  |    9.7 (2.40 + 4.89)  |  7.5 s, 36.3%
  tpu_v5p_32, 0.6b  |   95.74  |    7.8  |    8.5  |   10.4 (1.67 + 4.54)  |  2.5 s, 33.6%
  tpu_v5p_32, 1.7b  |   95.74  |   14.3  |   13.3  |   18.3 (4.81 + 8.76)  |  4.1 s, 57.0%

The roofline is the larger of a program's FLOPs over the chip's peak and its HBM bytes
over the chip's bandwidth, with every loop counted at its trip count (the decode loop at
max_new_tokens); the MFU bound is a bound, not a measurement. A v5p-32 holds far more
than 1.7B: configs/qwen3_8b_gsm8k.py is its recipe at 8B.
gpu_1 has no compiled figures: XLA:GPU compiles only with a GPU attached, and none was.
By arithmetic, its float32 weights and Adam's two moments (12 B per parameter) and the
bf16 reference (2 B) take 7.8 GiB at 0.6B and 22.4 GiB at 1.7B; the update adds float32
gradients (4 B per parameter) and its activations, the sampler its KV cache (28 layers x
8 KV heads x 128 x 2 x 2 B = 112 KiB per token, 7 GiB for 128 rows of 512 new tokens).
JAX preallocates 75% of the GPU's memory by default (60 GB of 80), which 1.7B can
outgrow, so raise the fraction:
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
    # One 80 GB GPU (not compiled here: XLA:GPU needs a GPU); 1.7B needs
    # XLA_PYTHON_CLIENT_MEM_FRACTION above JAX's default 0.75 (see the docstring).
    mesh.update(data=-1, fsdp=1, tensor=1)  # -1: the one device
    train.prompts_per_step, train.micro_batch_size, train.logprob_chunk_size = 16, 16, 128
  elif hardware == "tpu_v5e_8":
    # 15.75 GiB chips (XLA:TPU). 0.6B over fsdp=8: 4.9 GiB at the peak. 1.7B over fsdp=4 x
    # tensor=2: 9.7 GiB (tensor also splits the KV heads and the gathered decode weights); fsdp=8
    # alone would gather every layer's whole weights on each chip. data=-1 takes the rest
    # (2 on a v5litepod-16).
    mesh.update(data=-1, fsdp=8 if size == "0.6b" else 4, tensor=1 if size == "0.6b" else 2,
                topology="v5e:2x4")
    train.prompts_per_step, train.micro_batch_size, train.logprob_chunk_size = 32, 32, 128
  else:  # tpu_v5p_32: 16 chips of 95 GB
    # fsdp=4 within a host, data=4 across hosts: 1.7B peaks at 18.3 GiB of 95.7 with 128-row
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

  # gsm8k_exact, not math_verify (jaxrl_llm.rewards.math): on GSM8K's marked integer and
  # decimal answers the two agree, but math_verify also credits an unmarked "The answer is
  # 72", which gsm8k_exact scores 0 (the 0.1 format reward teaches the marker), and scores 0
  # a completion with two boxes (their set), where gsm8k_exact reads the last; its symbolic
  # equivalence adds nothing for integer answers (tests/rewards/math_verify_test.py).
  config.rewards.functions = ("jaxrl_llm.rewards.gsm8k:gsm8k_exact",
                              "jaxrl_llm.rewards.gsm8k:gsm8k_format")
  config.rewards.weights = (1.0, 0.1)
  config.optimizer.lr = 1e-6  # as verl's GSM8K GRPO example and TRL's GRPO default

  _hardware(config, next(iter(chosen), "gpu_1"), arg.size)
  if arg.runlocal:
    config_lib.shrink_for_local(config)
    s.max_prompt_len, s.prompt_buckets = 384, (384,)  # whole GSM8K prompts, one compile
  return config_lib.finalize(config)
