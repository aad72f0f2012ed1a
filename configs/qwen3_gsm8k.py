r"""GRPO on GSM8K with Qwen3-0.6B or Qwen3-1.7B: bf16 compute, remat, the chat template.

The GRPO axes of configs/grpo.py (group-normalised advantages, token clip 0.2, k3 KL
0.04 in the loss), Qwen3's chat template around each question, reward 1 for the right
final answer (`#### N` or `\boxed{N}`) plus 0.1 for marking one, held-out greedy
accuracy on GSM8K's test split. The variants set the mesh, the batch and the
micro-batches for one hardware; the algorithm and lengths are the same on all three.

Set-up (once; nothing downloads at run time):
  huggingface-cli download Qwen/Qwen3-0.6B --local-dir Qwen3-0.6B     # or Qwen/Qwen3-1.7B
  python -m launch.prepare_gsm8k --tfds_data_dir=$HOME/tensorflow_datasets --output_dir=gsm8k
  # or --gsm8k_jsonl_dir=grade-school-math/grade_school_math/data (openai/grade-school-math)

Run:  (from the directory holding Qwen3-0.6B/ and gsm8k/; elsewhere set
      --config.model.path and --config.data.source='jsonl:DIR/{split}.jsonl', gs:// too)
  python -m launch.train --config=configs/qwen3_gsm8k.py:gpu_1,size=0.6b --workdir=/tmp/q06
  python -m launch.train --config=configs/qwen3_gsm8k.py:tpu_v5e_8,size=1.7b --workdir=/tmp/q17
  python launch/tpu_pod.py train --name=pod --zone=us-east5-a --accelerator=v5p-32 \
      --config=configs/qwen3_gsm8k.py:tpu_v5p_32,size=1.7b --workdir=gs://BUCKET/q17
  python -m launch.train --config=configs/qwen3_gsm8k.py:runlocal --workdir=/tmp/q_local
Hardware: gpu_1 is one 80 GB GPU (A100/H100); tpu_v5e_8 one v5litepod-8 host (8 chips,
16 GB each; unchanged it also runs on a v5litepod-16, data=2); tpu_v5p_32 a v5p-32 slice
(16 chips of 95 GB on 4 hosts; JAX sees one device per chip). With no hardware named,
the gpu_1 values.
Expected result: not measured. This machine has no accelerator and no Qwen3 weights
(nothing downloads here), so no step of this recipe has run at these sizes. What is
tested: every variant passes `validate_config` on its device count (1, 8, 16 and a
v5e-16's 16 devices on 4 processes), the mesh divides the Qwen3 shapes it shards, and
`runlocal` trains two steps end to end on a tiny random Qwen3 checkpoint with a chat
template and GSM8K records (tests/qwen3_gsm8k_config_test.py). The memory figures
below are arithmetic, not measurements; please report a run.

Memory (the arithmetic behind the sizes). Parameters stay float32 (`param_dtype`) and
compute runs in bf16; per parameter the trainer holds the policy (4 B), its gradient
accumulator and gradient (8 B), Adam's two moments (8 B) and the frozen reference for
the KL term (4 B): 24 B, i.e. 14 GB for 0.6B (596M parameters) and 41 GB for 1.7B
(1.72B), divided by the mesh axes the parameters shard over (fsdp x tensor). Sampling
adds the weights cast to bf16 and gathered over fsdp (1.2 GB / 3.4 GB) and the KV cache,
28 layers x 2 x 8 KV heads x 128 x 2 B = 115 kB per token, for P x G rows of
max_prompt_len + max_new_tokens = 896 tokens: 103 MB per row, split over the batch
shards (and over tensor). Training with `remat='full'` keeps one bf16 [rows, 896, D]
input per layer and recomputes the rest; the largest transient is a log-prob chunk of
rows x logprob_chunk_size x 151,936 float32 logits.
"""
from configs import common
from configs import grpo

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
    # 1.7B: 41 GB of state + 3.4 GB of bf16 weights + the KV cache of 128 rows (13 GB)
    # + chunk logits of 16 rows (16 x 128 x 151,936 x 4 B = 1.2 GB, a few copies): ~60 GB
    # of 80. 0.6B: ~30 GB.
    mesh.update(data=-1, fsdp=1, tensor=1)  # -1: the one device
    train.prompts_per_step, train.micro_batch_size, train.logprob_chunk_size = 16, 16, 128
  elif hardware == "tpu_v5e_8":
    # 16 GB chips. 0.6B: fsdp=8, 14.3/8 = 1.8 GB of state + bf16 weights gathered for
    # decoding (1.2 GB) + a 256-row KV cache over 8 batch shards (3.3 GB): ~6.5 GB.
    # 1.7B over fsdp alone: 5.2 + 3.4 + 3.3 = 12 GB, too close to 16 with the compiler's
    # temporaries; fsdp=4 x tensor=2 keeps the state at 5.2 GB, halves the gathered copy
    # and splits the KV heads: ~10 GB. data=-1 takes the rest (2 on a v5litepod-16).
    mesh.update(data=-1, fsdp=8 if size == "0.6b" else 4, tensor=1 if size == "0.6b" else 2)
    train.prompts_per_step, train.micro_batch_size, train.logprob_chunk_size = 32, 32, 128
  else:  # tpu_v5p_32: 16 chips of 95 GB
    # fsdp=4 within a host, data=4 across hosts: 1.7B holds 41/4 = 10 GB of state + 3.4 GB
    # gathered + a 1,024-row KV cache over 16 shards (6.6 GB): ~20 GB of 95, room for
    # 128-row micro-batches (8 per chip) and 256-position log-prob chunks (1.2 GB).
    mesh.update(data=-1, fsdp=4, tensor=1)
    train.prompts_per_step, train.micro_batch_size, train.logprob_chunk_size = 128, 128, 256
  train.steps = TRAIN_PROMPTS // train.prompts_per_step
  train.eval_every = train.steps // 10
  config.checkpoint.every = train.eval_every


def get_config(arg=None):
  arg = common.parse_arg(arg, size="0.6b", runlocal=False, **{h: False for h in HARDWARE})
  if arg.size not in SIZES:
    raise ValueError(f"size={arg.size!r}: expected one of {', '.join(SIZES)}")
  chosen = [h for h in HARDWARE if arg[h]]
  if len(chosen) > 1:
    raise ValueError(f"{' and '.join(chosen)}: expected at most one of {', '.join(HARDWARE)}")
  config = grpo.get_config()  # the GRPO axes, unchanged

  m = config.model
  m.path = f"Qwen3-{arg.size.upper()}"  # a local HF directory (or gs://); see the docstring
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
  d.source = "jsonl:gsm8k/{split}.jsonl"  # launch/prepare_gsm8k.py writes train/eval
  d.chat_template = True  # the question as one user turn of Qwen3's template

  config.rewards.functions = ("jaxrl_llm.rewards.gsm8k:gsm8k_exact",
                              "jaxrl_llm.rewards.gsm8k:gsm8k_format")
  config.rewards.weights = (1.0, 0.1)
  config.optimizer.lr = 1e-6  # as verl's GSM8K GRPO example and TRL's GRPO default

  _hardware(config, next(iter(chosen), "gpu_1"), arg.size)
  if arg.runlocal:
    common.shrink_for_local(config)
    s.max_prompt_len, s.prompt_buckets = 384, (384,)  # whole GSM8K prompts, one compile
  return common.finalize(config)
