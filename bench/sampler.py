"""Sampler throughput on the standard workload, against Hugging Face `generate` in the same run.

Workload: Llama architecture, vocab 512, hidden 256, intermediate 768, 4 layers, 4 heads,
2 KV heads, head_dim 64, float32, random init; 8 prompts of 32 tokens, G = 8 (64 rows),
exactly 64 new tokens (no EOS), temperature 1.0.

  python bench/sampler.py                # ours and HF generate, 3 interleaved rounds
  python bench/sampler.py --rounds 5     # more rounds
  python bench/sampler.py --no-hf        # ours only
  python bench/sampler.py --devices 1    # ours on one XLA CPU device (default: one per core)
  python bench/sampler.py --no-hf --rounds 1 --shape narrow --layers 28 --layer-loop scan
                                         # first call (compile) of a deep narrow model

Cores. XLA runs one CPU device's program mostly on one core (its matmuls at 64 rows gain
only 1.25-1.5x from a second thread), so ours exposes one XLA CPU device per core and
shards the 64 rows over them on the mesh's `data` axis, the program that runs on a TPU
slice; HF uses torch's intra-op threads (one per core). Both use every core.

Fairness. Each measurement runs in its own fresh process that imports only its own framework
(jax for ours, torch for HF), so neither's thread pool competes with or warms up the other,
and rounds alternate ours / HF so that load from other processes on the machine hits both
alike. Every worker warms up (compiles) first, then times `--reps` calls and reports the
median. The table shows medians over rounds; the ratio is taken per round (same load) and its
median reported, with the load average seen by each worker.

Prefill/decode split: "prefill" is the same call with one new token (one token chosen, no
decode step), for both samplers; decode = whole call - prefill, and decode tokens/s counts
all P*G*N tokens over that decode time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

MODEL = dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=10000.0,
             rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False)
P, PROMPT_LEN, G, NEW = 8, 32, 8, 64
TOKENS = P * G * NEW
NARROW = dict(hidden_size=64, intermediate_size=192, num_attention_heads=2, num_key_value_heads=1,
              head_dim=32)  # `--shape narrow`: compile time dominated by the program's depth


def _prompts():
  rng = np.random.RandomState(0)
  return [[int(t) for t in rng.randint(4, 99, PROMPT_LEN)] for _ in range(P)]


def _median_time(fn, reps):
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


# --- workers: each runs in its own process -----------------------------------------------------
def worker_hf(path, reps):
  import torch
  import transformers
  model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  ids = torch.tensor([p for p in _prompts() for _ in range(G)])  # prompt-major, like ours

  def timed(new_tokens):
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
              min_new_tokens=new_tokens, use_cache=True, pad_token_id=0, eos_token_id=2)
    with torch.inference_mode():
      run = lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
      t0 = time.perf_counter()
      run()
      first = time.perf_counter() - t0
      run()  # warm-up
      return _median_time(run, reps), first

  total, _ = timed(NEW)
  prefill, _ = timed(1)
  return dict(total=total, prefill=prefill, threads=torch.get_num_threads())  # nothing to compile


def worker_ours(path, reps, devices, layer_loop):
  # One XLA CPU device per core, the batch sharded over them (the mesh's data axis): the
  # same program that runs data-parallel over the chips of a TPU slice.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={devices}")
  import jax
  from jaxrl_llm import models, sampling
  from jaxrl_llm import sharding as sh
  model = models.from_pretrained(path)
  if devices > 1:
    model = models.place(model, sh.make_mesh({"data": devices, "fsdp": 1, "tensor": 1}))
  else:
    model = models.Model(jax.device_put(model.params), model.config)
  prompts, seeds = _prompts(), iter(range(10_000))

  def timed(new_tokens):
    sampler = sampling.Sampler(sampling.SamplingSettings(num_samples=G, max_new_tokens=new_tokens,
                                                         temperature=1.0, layer_loop=layer_loop))
    run = lambda: jax.block_until_ready(sampler(model, prompts, next(seeds)).tokens)
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    run()  # warm-up
    return _median_time(run, reps), first

  total, first = timed(NEW)
  prefill, _ = timed(1)
  return dict(total=total, prefill=prefill, compile=first - total, first=first,
              devices=len(jax.devices()))


def _spawn(which, path, reps, devices, layer_loop):
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", which, "--path", path,
         "--reps", str(reps), "--devices", str(devices), "--layer-loop", layer_loop]
  out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
  result = json.loads(out.strip().splitlines()[-1])
  result["load"] = os.getloadavg()[0]
  return result


# --- driver -------------------------------------------------------------------------------------
def _row(name, runs):
  med = lambda key: statistics.median(r[key] for r in runs)
  total, prefill = med("total"), med("prefill")
  decode = total - prefill
  compile_s = f"{med('first'):.2f} / {med('compile'):.2f}" if "compile" in runs[0] else "-"
  return (f"| {name} | {total:.3f} | {TOKENS / total:,.0f} | {prefill:.3f} | {decode:.3f} | "
          f"{TOKENS / decode:,.0f} | {compile_s} |")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--no-hf", action="store_true")
  ap.add_argument("--reps", type=int, default=6)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--worker", choices=("ours", "hf"))
  ap.add_argument("--path")
  ap.add_argument("--devices", type=int, default=os.cpu_count(),
                  help="XLA CPU devices for ours (default: one per core)")
  ap.add_argument("--shape", choices=("standard", "narrow"), default="standard",
                  help="narrow: hidden 64, so that compile time shows the program's depth")
  ap.add_argument("--layers", type=int, default=MODEL["num_hidden_layers"])
  ap.add_argument("--layer-loop", default="auto", help="config.sampling.layer_loop for ours")
  args = ap.parse_args()
  if args.worker == "ours":
    print(json.dumps(worker_ours(args.path, args.reps, args.devices, args.layer_loop)))
    return 0
  if args.worker == "hf":
    print(json.dumps(worker_hf(args.path, args.reps)))
    return 0

  import torch
  import transformers
  torch.manual_seed(0)
  shape = {**MODEL, **(NARROW if args.shape == "narrow" else {}),
           "num_hidden_layers": args.layers}
  hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      **shape, bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
  path = tempfile.mkdtemp()
  hf.save_pretrained(path)
  del hf

  ours, theirs = [], []
  for r in range(args.rounds):
    ours.append(_spawn("ours", path, args.reps, args.devices, args.layer_loop))
    if not args.no_hf:
      theirs.append(_spawn("hf", path, args.reps, args.devices, args.layer_loop))
    print(f"round {r}: ours {TOKENS / ours[-1]['total']:,.0f} tokens/s (load {ours[-1]['load']:.1f})"
          + ("" if args.no_hf else f", HF {TOKENS / theirs[-1]['total']:,.0f} tokens/s "
                                    f"(load {theirs[-1]['load']:.1f})"), flush=True)

  print(f"\n{args.shape} model, {args.layers} layers, layer_loop={args.layer_loop}: {P} prompts x "
        f"{PROMPT_LEN} tokens, G={G}, {NEW} new tokens, float32, {os.cpu_count()} CPUs; medians "
        f"over {args.rounds} rounds of {args.reps} calls\n")
  print("| sampler | s/call | tokens/s | prefill s | decode s | decode tokens/s | "
        "first call / compile s |")
  print("|---|---|---|---|---|---|---|")
  print(_row(f"jaxrl_llm sampler ({ours[0]['devices']} CPU devices, batch over 'data')", ours))
  if args.no_hf:
    return 0
  print(_row(f"HF transformers generate ({theirs[0]['threads']} torch threads)", theirs))
  whole = [h["total"] / o["total"] for o, h in zip(ours, theirs)]
  decode = [(h["total"] - h["prefill"]) / (o["total"] - o["prefill"]) for o, h in zip(ours, theirs)]
  print(f"\nratio ours / HF, per round: whole call {', '.join(f'{x:.2f}x' for x in whole)} "
        f"(median {statistics.median(whole):.2f}x); decode tokens/s "
        f"{', '.join(f'{x:.2f}x' for x in decode)} (median {statistics.median(decode):.2f}x)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
