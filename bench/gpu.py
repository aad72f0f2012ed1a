"""The accelerator benchmark in one command: sampler vs transformers `generate`, and the RL step.

Run from the checkout on a GPU machine that has jax[cuda], torch and transformers but no
package index, with the wheels of ml_collections and tensorboardX in an ignored `.whl/`
folder beside it:

  python3 bench/gpu.py               # the Qwen3-0.6B shape, bf16
  TINY=1 python3 bench/gpu.py        # tiny shapes: a dry run on the CPU before spending device time

Phases, each in its own process (torch and jax never share the device), each with a time limit:
  make_model  a random Qwen3-0.6B-shaped checkpoint (28 layers, hidden 1024, 16 heads, 8 kv
              heads of 128, vocab 151,936, tied, bf16) and a character tokenizer, by transformers
  hf          transformers `generate` (sdpa, bf16): 64 prompts of 128 tokens x G 8 x 128 new
  ours        `sampling.generate` on a one-device mesh, the same workload, with the bytes a
              decode step must read and the fraction of a copy bandwidth measured in the same
              process that its time implies (LAYER_LOOP=unrolled|scan overrides 'auto',
              KEY_LAYOUT=slot_minor|slot_major the platform's key layout; both for longtail too)
  train       `bench/train_step.py --shape=qwen3_0_6b --set=model.remat=none`: GRPO with a
              reference, 32 prompts x G 8 x (128 + 128) tokens, micro-batch 64, bf16 compute /
              float32 parameters, no remat: step split, MFU against the data-sheet peak, first
              step, compiled memory
  train_big   the policy update of 64 prompts x G 8 x (128 + 256) tokens at micro-batch 128,
              without remat (out of memory on 2026-11-30): compiled and run once
  longtail    the long-tail lengths of `bench/sampler.py --lengths=longtail` (90% of the
              completions end between 16 and 64 tokens, 10% run to 512; 8 with TINY), same
              prompts: the static and the continuous engine, useful tokens/s, KV memory, and
              the fraction of the copy bandwidth the continuous engine's time implies
              (weights once per decode step, every token's attention over its own prefix)
  hf_longtail transformers `generate` on those lengths (EOS forced at each row's length)
  partial     `bench/async.py --modes=tail,tail_partial` on the Qwen3-0.6B body (128-token
              vocabulary, uniform next token: geometric lengths, mean 128, up to 512):
              GRPO step time at max_async_level 1 without and with partial rollouts
  publish     `bench/publish.py --placements=shared` on the Qwen3-0.6B shape: the weight publish
              of asynchronous rollouts on one device (the float32 parameters cast to the
              sampler's bf16 copy), from ready parameters to a ready copy
Each phase prints a RESULT line; the last lines are a summary. BUDGET_S=N ends the whole run
within N seconds: each phase gets what is left, up to its own limit, in the order make_model,
ours, train, partial, publish, hf, longtail, hf_longtail, train_big. Results go to $OUT (default
/tmp/gpu_out) as logs and JSON.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TINY = os.environ.get("TINY") == "1"
P, G = (4, 2) if TINY else (64, 8)
PROMPT_LEN = 16 if TINY else 128
NEW = 8 if TINY else 128
REPS = 2 if TINY else 3
ARCH = dict(vocab_size=600, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16) if TINY else dict(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128)
LAYER_LOOP = os.environ.get("LAYER_LOOP", "auto")  # the sampler's (sampling.SamplingSettings)
KEY_LAYOUT = os.environ.get("KEY_LAYOUT")  # overrides the platform's (decode.DECODE_TUNING)
LONG_NEW = 32 if TINY else 512
LIMITS = dict(make_model=90, hf=90, ours=120, longtail=120, hf_longtail=60, train=240,
              partial=240, publish=60, train_big=100)  # 18.7 min in all: BUDGET_S cuts the last


def prompts():
  import numpy as np
  rng = np.random.RandomState(0)
  return [[int(t) for t in rng.randint(10, 500, PROMPT_LEN)] for _ in range(P)]


def emit(name, **kv):
  print("RESULT", json.dumps({"phase": name, **kv}), flush=True)


def make_model(path):
  import torch
  import transformers
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
  cfg = transformers.Qwen3Config(**ARCH, tie_word_embeddings=True, rope_theta=1e6,
                                 rms_norm_eps=1e-6, max_position_embeddings=4096,
                                 bos_token_id=1, eos_token_id=2, pad_token_id=0)
  torch.manual_seed(0)
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  with torch.device(dev):
    model = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16)
  model.save_pretrained(path)
  specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
  toks = specials + [chr(c) for c in range(32, 127)]
  tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(toks)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  tok.decoder = decoders.Fuse()
  transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                       eos_token="<eos>", unk_token="<unk>").save_pretrained(path)
  emit("make_model", params=sum(p.numel() for p in model.parameters()), device=dev)


def timed_generate(model, ids, dev, **kw) -> float:
  """Seconds of one sampled `generate` call on `ids` (temperature 1, no truncation)."""
  import torch
  kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0,
            use_cache=True, **kw)
  with torch.inference_mode():
    if dev == "cuda":
      torch.cuda.synchronize()
    t = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    if dev == "cuda":
      torch.cuda.synchronize()
    return time.perf_counter() - t


def hf(path):
  import torch
  import transformers
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev).eval()
  ids = torch.tensor([p for p in prompts() for _ in range(G)], device=dev)

  def call(n):
    return timed_generate(model, ids, dev, max_new_tokens=n, min_new_tokens=n, eos_token_id=2)

  call(4)
  times = [call(NEW) for _ in range(REPS)]
  prefill = statistics.median(call(1) for _ in range(2))
  total = statistics.median(times)
  emit("hf", rows=P * G, new=NEW, times=times, total_s=total, prefill_s=prefill,
       tokens_per_s=P * G * NEW / total, decode_tokens_per_s=P * G * NEW / (total - prefill),
       peak_gib=torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0,
       torch=torch.__version__, transformers=transformers.__version__)


def bandwidth(device) -> float:
  """Bytes per second a device copies (read + write) on a 1 GiB array (64 MiB with TINY)."""
  import jax
  import jax.numpy as jnp
  n = (2**24 if TINY else 2**28)
  x = jax.device_put(jnp.ones((n,), jnp.float32), device)
  copy = jax.jit(lambda a: a + 1.0)
  jax.block_until_ready(copy(x))
  times = []
  for _ in range(5):
    t = time.perf_counter()
    jax.block_until_ready(copy(x))
    times.append(time.perf_counter() - t)
  return 2 * 4 * n / min(times)


def decode_bytes(cfg, P, G, S0, mean_len) -> dict:
  """Bytes one decode step must read: every layer's weights and the unembedding once, the
  shared prompt KV once per prompt, each row's generated KV at the call's mean length."""
  from jaxrl_llm.models import flops
  item = 2  # bf16
  weights = (cfg.num_layers * flops.layer_params(cfg) + cfg.hidden_size * cfg.vocab_size) * item
  per_slot = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * item  # k and v
  return dict(weights=weights, prompt_kv=P * S0 * per_slot, generated_kv=P * G * mean_len * per_slot)


def tuned() -> dict:
  """The decode tuning the phase runs with: the platform's, with KEY_LAYOUT's key layout."""
  import dataclasses
  import jax
  from jaxrl_llm.sampling import decode
  platform = jax.devices()[0].platform
  if KEY_LAYOUT:
    decode.DECODE_TUNING[platform] = dataclasses.replace(decode.DECODE_TUNING[platform],
                                                         key_layout=KEY_LAYOUT)
  return dict(layer_loop=LAYER_LOOP, key_layout=decode.DECODE_TUNING[platform].key_layout)


def ours(path):
  import jax
  import numpy as np
  from jaxrl_llm import models, sampling, sharding
  tuning = tuned()
  t = time.perf_counter()
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  model = models.from_pretrained(path, dtype="bfloat16", mesh=mesh)
  load_s = time.perf_counter() - t
  ps = prompts()

  def call(n, seed):
    t = time.perf_counter()
    out = sampling.generate(model, ps, num_samples=G, max_new_tokens=n, temperature=1.0,
                            eos_ids=(), seed=seed, layer_loop=LAYER_LOOP)
    jax.block_until_ready(out)
    return time.perf_counter() - t, out

  first, out = call(NEW, 0)
  times = [call(NEW, s)[0] for s in range(1, REPS + 1)]
  call(1, 0)
  prefill = statistics.median(call(1, s)[0] for s in range(1, 3))
  total = statistics.median(times)
  stats = jax.devices()[0].memory_stats() or {}
  step_s = (total - prefill) / (NEW - 1)
  moved = decode_bytes(model.config, P, G, PROMPT_LEN, NEW / 2)
  bw = bandwidth(jax.devices()[0])
  emit("ours", rows=P * G, new=NEW, load_s=load_s, first_call_s=first, times=times,
       total_s=total, prefill_s=prefill, tokens_per_s=P * G * NEW / total,
       decode_tokens_per_s=P * G * NEW / (total - prefill), decode_step_s=step_s,
       bytes_per_step=moved, bandwidth_bytes_per_s=bw,
       bandwidth_fraction=sum(moved.values()) / bw / step_s,
       min_len=int(np.asarray(out.lengths).min()),
       peak_gib=stats.get("peak_bytes_in_use", 0) / 2**30, jax=jax.__version__,
       device=str(jax.devices()[0]), **tuning)


def longtail_budgets():
  """Each completion's length, prompt-major: 10% run to LONG_NEW, the rest end early."""
  import numpy as np
  rng = np.random.RandomState(1)
  short = rng.randint(4, 9, P * G) if TINY else rng.randint(16, 65, P * G)
  return np.where(rng.rand(P * G) < 0.1, LONG_NEW, short).astype(np.int32)


def longtail(path):
  import jax
  import numpy as np
  from jaxrl_llm import models, sampling, sharding
  tuning = tuned()
  mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  model = models.from_pretrained(path, dtype="bfloat16", mesh=mesh)
  ps, budgets = prompts(), longtail_budgets()
  useful = int(budgets.sum())
  found = {}
  for engine in ("static", "continuous"):
    sampler = sampling.Sampler(sampling.SamplingSettings(
        G, LONG_NEW, 1.0, layer_loop=LAYER_LOOP, engine=engine, slots=P * G // 4))
    t = time.perf_counter()
    jax.block_until_ready(sampler(model, ps, 0, budgets))
    first = time.perf_counter() - t
    t = time.perf_counter()
    out = jax.block_until_ready(sampler(model, ps, 1, budgets))
    total = time.perf_counter() - t
    assert np.array_equal(np.asarray(out.lengths), budgets)
    found[engine] = dict(total_s=total, first_call_s=first, tokens_per_s=useful / total,
                         kv_bytes=sampler.kv_bytes(), steps=int(sampler.stats["steps"]),
                         peak_pages=int(sampler.stats.get("peak_pages", 0)))
  moved = decode_bytes(model.config, 1, 1, 0, 0)
  per_slot = model.config.num_layers * 2 * model.config.num_kv_heads * model.config.head_dim * 2
  kv_read = int(sum(PROMPT_LEN * n + n * (n - 1) // 2 for n in budgets)) * per_slot
  c = found["continuous"]
  bw = bandwidth(jax.devices()[0])
  needed = c["steps"] * moved["weights"] + kv_read
  emit("longtail", useful_tokens=useful, new=LONG_NEW, engines=found,
       bandwidth_bytes_per_s=bw, continuous_bytes=needed,
       continuous_bandwidth_fraction=needed / bw / c["total_s"], jax=jax.__version__,
       device=str(jax.devices()[0]), **tuning)


def hf_longtail(path):
  import torch
  import transformers
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev).eval()
  ids = torch.tensor([p for p in prompts() for _ in range(G)], device=dev)
  budgets = torch.tensor(longtail_budgets(), device=dev)
  eos = 2

  class ForcedLengths(transformers.LogitsProcessor):
    def __call__(self, input_ids, scores):
      ends = budgets == input_ids.shape[1] - PROMPT_LEN + 1
      scores[:, eos] = -float("inf")
      scores[ends] = -float("inf")
      scores[ends, eos] = 0.0
      return scores

  total = timed_generate(model, ids, dev, max_new_tokens=LONG_NEW, eos_token_id=eos,
                         logits_processor=transformers.LogitsProcessorList([ForcedLengths()]))
  useful = int(budgets.sum())
  emit("hf_longtail", useful_tokens=useful, total_s=total, tokens_per_s=useful / total)


def _run(phase, args, out_dir, env, deadline):
  log = os.path.join(out_dir, f"{phase}.log")
  t = time.perf_counter()
  limit = min(LIMITS[phase], deadline - t)
  if limit < 20:
    print(f"== {phase}: skipped, {max(0, deadline - t):.0f} s of BUDGET_S left", flush=True)
    return None
  try:
    with open(log, "w") as f:
      rc = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                          timeout=limit).returncode
  except subprocess.TimeoutExpired:
    rc = "timeout"
  results = [json.loads(line.split(" ", 1)[1]) for line in open(log) if line.startswith("RESULT ")]
  print(f"== {phase}: rc {rc}, {time.perf_counter() - t:.0f} s", flush=True)
  if rc != 0:
    print("".join(open(log).readlines()[-15:]))
  return results[-1] if results else None


def main():
  out_dir = os.environ.get("OUT", "/tmp/gpu_out")
  os.makedirs(out_dir, exist_ok=True)
  env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
             XLA_PYTHON_CLIENT_MEM_FRACTION="0.9")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
  model_dir = os.path.join(out_dir, "model") if TINY else "/tmp/q3"
  me = [sys.executable, os.path.abspath(__file__)]
  step = [sys.executable, os.path.join(HERE, "train_step.py"),
          f"--shape={'tiny' if TINY else 'qwen3_0_6b'}", "--warmup=1", "--steps=3",
          "--set=model.remat=none"]  # the memory fits: no recomputation (MFU counts none)
  phases = {  # in order of what matters most when BUDGET_S cuts the run short
      "make_model": me + ["make_model", model_dir],
      "ours": me + ["ours", model_dir],
      "train": step,
      "partial": [sys.executable, os.path.join(HERE, "async.py"), "--modes=tail,tail_partial",
                  f"--shape={'tiny' if TINY else 'qwen3_0_6b'}", "--devices=1", "--warmup=1",
                  "--steps=2"],
      "publish": [sys.executable, os.path.join(HERE, "publish.py"), "--placements=shared",
                  f"--shape={'tiny' if TINY else 'qwen3_0_6b'}", "--devices=1", "--steps=5"],
      "hf": me + ["hf", model_dir],
      "longtail": me + ["longtail", model_dir],
      "hf_longtail": me + ["hf_longtail", model_dir],
      "train_big": step + ["--memory_only", "--run_update", "--micro_batch=128", "--prompts=64",
                           "--new_tokens=256"],
  }
  deadline = time.perf_counter() + float(os.environ.get("BUDGET_S", sum(LIMITS.values())))
  results = {name: _run(name, args, out_dir, env, deadline) for name, args in phases.items()}
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  o, h, t = results["ours"], results["hf"], results["train"]
  if o and h:
    print(f"sampler: ours {o['tokens_per_s']:.0f} tokens/s ({o['total_s']:.3f} s/call, first "
          f"{o['first_call_s']:.1f} s, peak {o['peak_gib']:.1f} GiB) vs generate "
          f"{h['tokens_per_s']:.0f} -> {o['tokens_per_s'] / h['tokens_per_s']:.2f}x")
    moved = o["bytes_per_step"]
    print(f"decode step {1e3 * o['decode_step_s']:.2f} ms reads {sum(moved.values()) / 1e9:.2f} GB "
          f"(weights {moved['weights'] / 1e9:.2f}, prompt KV {moved['prompt_kv'] / 1e9:.2f}, "
          f"generated KV {moved['generated_kv'] / 1e9:.2f}); at the {o['bandwidth_bytes_per_s'] / 1e12:.2f}"
          f" TB/s measured copy rate that is {100 * o['bandwidth_fraction']:.0f}% of the limit")
  lt, hl = results["longtail"], results["hf_longtail"]
  if lt:
    e = lt["engines"]
    print(f"long tail ({lt['useful_tokens']} useful tokens, up to {lt['new']} new): static "
          f"{e['static']['tokens_per_s']:.0f} tokens/s, continuous "
          f"{e['continuous']['tokens_per_s']:.0f} ("
          f"{e['continuous']['tokens_per_s'] / e['static']['tokens_per_s']:.2f}x static"
          + (f", {e['continuous']['tokens_per_s'] / hl['tokens_per_s']:.2f}x generate's "
             f"{hl['tokens_per_s']:.0f}" if hl else "")
          + f"); KV {e['static']['kv_bytes'] / 2**30:.2f} / {e['continuous']['kv_bytes'] / 2**30:.2f}"
          f" GiB; continuous at {100 * lt['continuous_bandwidth_fraction']:.0f}% of the copy "
          "bandwidth limit")
  if t:
    print(f"train step {t['step_s']:.3f} s (sample {t['sample_s']:.3f}, log-probs "
          f"{t['logprob_s']:.3f}, update {t['update_s']:.3f}); MFU {100 * t['mfu']:.1f}%, update "
          f"MFU {100 * t['update_mfu']:.1f}%; first step {t['first_step_s']:.1f} s")
  pr = results["partial"]
  if pr:
    tail, part = pr["results"]
    print(f"long-tailed GRPO step at max_async_level 1: {tail['step_time_s']:.2f} s, with partial "
          f"rollouts {part['step_time_s']:.2f} s ({tail['step_time_s'] / part['step_time_s']:.2f}x)")
  pu = results["publish"]
  if pu:
    r = pu["results"][0]
    print(f"weight publish (shared placement): {1e3 * r['publish_s']:.1f} ms for "
          f"{r['copy_bytes'] / 2**30:.2f} GiB")
  big = results["train_big"]
  if big:
    p = big["policy_step"]
    print(f"micro-batch {p['micro_batch']} x {p['tokens_per_row']} tokens, no remat: policy "
          f"update needs {p['temp_bytes'] / 2**30:.1f} GiB of temporaries, ran: {p['run_s']}")


if __name__ == "__main__":
  if len(sys.argv) > 1:
    {"make_model": make_model, "hf": hf, "ours": ours, "longtail": longtail,
     "hf_longtail": hf_longtail}[sys.argv[1]](sys.argv[2])
  else:
    main()
