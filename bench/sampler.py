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
  python bench/sampler.py --lengths longtail,uniform
                                         # the engines on realistic lengths (below)

Lengths (`--lengths`). The standard workload gives every completion the same 64 tokens.
`longtail`: 32 prompts x G = 8 (256 completions), up to 512 new tokens; 90% of the
completions end between 16 and 64 tokens, 10% run to 512 (a fixed seeded schedule).
`uniform`: the same requests, every completion 512 tokens. Every sampler sees the same
lengths: ours through per-completion budgets (`Sampler(..., budgets=...)`, the row ends
there), HF through a logits processor that forces the EOS at that length and forbids it
before. Reported: useful tokens/s (the tokens of the schedule over the call's time) of the
static engine, the continuous engine and HF `generate`, and the KV memory of each engine:
the buffers it allocates, and for the continuous engine the most pages in use at once.
Both engines run on one XLA CPU device per core (batch over `data`): the static engine as
one program over the mesh, the continuous one as one engine per device, each with its share
of the prompts and of the slots (`--continuous-devices` to change).

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
             rms_norm_eps=1e-6, max_position_embeddings=1024, tie_word_embeddings=False)
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


def _load_ours(path, devices):
  """The checkpoint as our model, on `devices` XLA CPU devices (set before jax starts),
  the batch over `data` when more than one."""
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={devices}")
  import jax
  from jaxrl_llm import models
  from jaxrl_llm import sharding as sh
  model = models.from_pretrained(path)
  if devices > 1:
    return models.place(model, sh.make_mesh({"data": devices, "fsdp": 1, "tensor": 1}))
  return models.Model(jax.device_put(model.params), model.config)


def worker_ours(path, reps, devices, layer_loop):
  # One XLA CPU device per core, the batch sharded over them (the mesh's data axis): the
  # same program that runs data-parallel over the chips of a TPU slice.
  model = _load_ours(path, devices)
  import jax
  from jaxrl_llm import sampling
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


# --- realistic lengths (`--lengths`) ---------------------------------------------------------------
LONG_P, LONG_N = 32, 512


def _schedule(lengths: str) -> np.ndarray:
  """Each completion's length, prompt-major: `longtail` or `uniform` (module docstring)."""
  rng = np.random.RandomState(1)
  R = LONG_P * G
  if lengths == "uniform":
    return np.full(R, LONG_N, np.int32)
  tail = np.where(rng.rand(R) < 0.1, LONG_N, rng.randint(16, 65, R))
  return tail.astype(np.int32)


def _long_prompts():
  rng = np.random.RandomState(0)
  return [[int(t) for t in rng.randint(4, 99, PROMPT_LEN)] for _ in range(LONG_P)]


def worker_lengths_ours(path, lengths, engine, devices, slots, page_size):
  model = _load_ours(path, devices)
  import jax
  from jaxrl_llm import sampling
  budgets = _schedule(lengths)
  settings = sampling.SamplingSettings(num_samples=G, max_new_tokens=LONG_N, temperature=1.0,
                                       engine=engine, slots=slots, page_size=page_size)
  sampler = sampling.Sampler(settings)
  run = lambda seed: jax.block_until_ready(sampler(model, _long_prompts(), seed, budgets).lengths)
  t0 = time.perf_counter()
  run(0)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  got = run(1)
  total = time.perf_counter() - t0
  assert np.array_equal(np.asarray(got), budgets), "the schedule was not followed"
  page_bytes = 0
  if engine == "continuous":
    pool = sampler.cache if isinstance(sampler.cache, dict) else sampler.cache[0]
    pages = pool["pages_k"].shape[-4]
    page_bytes = sampler.kv_bytes() // pages  # one page of keys and values in every layer
  return dict(total=total, first=first, tokens=int(budgets.sum()), kv=sampler.kv_bytes(),
              live=int(sampler.stats.get("peak_pages", 0)) * page_bytes,
              steps=int(sampler.stats["steps"]), devices=len(jax.devices()),
              slots=_slots(settings, model) if engine == "continuous" else LONG_P * G)


def _slots(settings, model) -> int:
  """The continuous engine's decode slots over all its engines."""
  from jaxrl_llm.sampling import continuous
  shards = continuous.batch_shards(model, LONG_P)[1]
  return continuous.engine_slots(settings, LONG_P * G, shards) * shards


def worker_lengths_hf(path, lengths):
  import torch
  import transformers
  model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  budgets = torch.tensor(_schedule(lengths))
  ids = torch.tensor([p for p in _long_prompts() for _ in range(G)])
  eos = 2

  class ForcedLengths(transformers.LogitsProcessor):
    """EOS exactly at each row's scheduled length, never before."""

    def __call__(self, input_ids, scores):
      made = input_ids.shape[1] - PROMPT_LEN  # new tokens so far
      ends = budgets == made + 1
      scores[:, eos] = -float("inf")
      scores[ends] = -float("inf")
      scores[ends, eos] = 0.0
      return scores

  kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=LONG_N,
            use_cache=True, pad_token_id=0, eos_token_id=eos,
            logits_processor=transformers.LogitsProcessorList([ForcedLengths()]))
  with torch.inference_mode():
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    total = time.perf_counter() - t0
  made = (out[:, PROMPT_LEN:] == eos).int().argmax(dim=1) + 1  # the only EOS ends the row
  assert torch.equal(made, budgets), "the schedule was not followed"
  return dict(total=total, tokens=int(budgets.sum()), threads=torch.get_num_threads())


def _spawn_lengths(args, path, which, lengths, engine="", devices=1):
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", which, "--path", path,
         "--lengths", lengths, "--engine", engine, "--devices", str(devices),
         "--slots", str(args.slots), "--page-size", str(args.page_size)]
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f"{which} worker failed:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def main_lengths(args, path):
  """The engines (and HF generate) on the `--lengths` workloads, one table."""
  rows, by = [], {}
  for lengths in args.lengths.split(","):
    runs = [("static", "ours", "static", args.devices),
            ("continuous", "ours", "continuous", args.continuous_devices)]
    if not args.no_hf:
      runs.append(("HF generate", "hf_lengths", "", 1))
    for name, which, engine, devices in runs:
      r = _spawn_lengths(args, path, "ours_lengths" if which == "ours" else which, lengths,
                         engine, devices)
      by[(lengths, name)] = r["tokens"] / r["total"]
      where = (f"{r['devices']} CPU device(s), {r['slots']} rows/slots" if which == "ours"
               else f"{r['threads']} torch threads")
      kv = (f"{r['kv'] / 2**20:.0f}" + (f" ({r['live'] / 2**20:.0f} live)" if r.get("live") else "")
            if which == "ours" else "-")
      rows.append(f"| {lengths} | {name} ({where}) | {r['tokens']:,} | {r['total']:.2f} | "
                  f"{r['tokens'] / r['total']:,.0f} | {kv} |")
      print(rows[-1], flush=True)
  print(f"\n{LONG_P} prompts x G={G}, up to {LONG_N} new tokens, float32, {os.cpu_count()} CPUs; "
        f"one timed call after a warm-up call\n")
  print("| lengths | sampler | useful tokens | s/call | useful tokens/s | KV MiB |")
  print("|---|---|---|---|---|---|")
  print("\n".join(rows))
  for lengths in args.lengths.split(","):
    if (lengths, "static") in by:
      print(f"{lengths}: continuous / static {by[(lengths, 'continuous')] / by[(lengths, 'static')]:.2f}x"
            + (f", continuous / HF {by[(lengths, 'continuous')] / by[(lengths, 'HF generate')]:.2f}x"
               if (lengths, "HF generate") in by else ""))
  if ("longtail", "continuous") in by and ("uniform", "continuous") in by:
    print(f"continuous, longtail / uniform: "
          f"{by[('longtail', 'continuous')] / by[('uniform', 'continuous')]:.2f}x")
  return 0


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
  ap.add_argument("--worker", choices=("ours", "hf", "ours_lengths", "hf_lengths"))
  ap.add_argument("--path")
  ap.add_argument("--devices", type=int, default=os.cpu_count(),
                  help="XLA CPU devices for ours (default: one per core)")
  ap.add_argument("--shape", choices=("standard", "narrow"), default="standard",
                  help="narrow: hidden 64, so that compile time shows the program's depth")
  ap.add_argument("--layers", type=int, default=MODEL["num_hidden_layers"])
  ap.add_argument("--layer-loop", default="auto", help="config.sampling.layer_loop for ours")
  ap.add_argument("--lengths", default="",
                  help="longtail and/or uniform (comma-separated): the engines on those lengths")
  ap.add_argument("--engine", default="", help="(worker) static or continuous")
  ap.add_argument("--slots", type=int, default=0,
                  help="the continuous engine's decode slots (0: its default)")
  ap.add_argument("--page-size", type=int, default=32, help="the continuous engine's page size")
  ap.add_argument("--continuous-devices", type=int, default=os.cpu_count())
  args = ap.parse_args()
  if args.worker == "ours_lengths":
    print(json.dumps(worker_lengths_ours(args.path, args.lengths, args.engine, args.devices,
                                         args.slots, args.page_size)))
    return 0
  if args.worker == "hf_lengths":
    print(json.dumps(worker_lengths_hf(args.path, args.lengths)))
    return 0
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
  if args.lengths:
    return main_lengths(args, path)

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
