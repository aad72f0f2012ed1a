"""Sampler throughput on the standard workload, against Hugging Face `generate` in the same run.

Workload: Llama architecture, vocab 512, hidden 256, intermediate 768, 4 layers, 4 heads,
2 KV heads, head_dim 64, float32, random init; 8 prompts of 32 tokens, G = 8 (64 rows),
exactly 64 new tokens (no EOS), temperature 1.0.

  python bench/sampler.py            # ours and HF generate (needs torch + transformers)
  python bench/sampler.py --no-hf    # ours only

Prints a table: median seconds per call, tokens/s, the prefill/decode split, compile time,
and the decode tokens/s ratio against HF measured in this run.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

MODEL = dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=10000.0,
             rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False)
P, PROMPT_LEN, G, NEW = 8, 32, 8, 64


def _timed(fn, reps):
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times), times


def bench_hf(model, prompts, reps):
  import torch
  ids = torch.tensor([p for p in prompts for _ in range(G)])
  kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW,
            min_new_tokens=NEW, use_cache=True, pad_token_id=0, eos_token_id=2)
  with torch.inference_mode():
    run = lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    run(), run()  # warm-up
    return _timed(run, reps)


def bench_ours(path, prompts, reps):
  import jax
  from jaxrl_llm import models, sampling
  model = models.from_pretrained(path)
  model = models.Model(jax.device_put(model.params), model.config)
  settings = sampling.SamplingSettings(num_samples=G, max_new_tokens=NEW, temperature=1.0)
  sampler = sampling.Sampler(settings)
  seeds = iter(range(10_000))
  call = lambda: jax.block_until_ready(sampler(model, prompts, next(seeds)).tokens)
  t0 = time.perf_counter()
  call()
  first = time.perf_counter() - t0
  call()
  total, _ = _timed(call, reps)
  # Prefill alone: the same program with one new token (one token chosen, no decode step).
  prefill_sampler = sampling.Sampler(sampling.SamplingSettings(num_samples=G, max_new_tokens=1))
  pre = lambda: jax.block_until_ready(prefill_sampler(model, prompts, next(seeds)).tokens)
  pre(), pre()
  prefill, _ = _timed(pre, reps)
  return dict(total=total, first=first, prefill=prefill, compile=first - total)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--no-hf", action="store_true")
  ap.add_argument("--reps", type=int, default=6)
  args = ap.parse_args()
  import torch
  import transformers
  torch.manual_seed(0)
  hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      **MODEL, bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
  path = tempfile.mkdtemp()
  hf.save_pretrained(path)
  rng = np.random.RandomState(0)
  prompts = [list(rng.randint(4, 99, PROMPT_LEN)) for _ in range(P)]
  tokens = P * G * NEW

  ours = bench_ours(path, prompts, args.reps)
  decode = ours["total"] - ours["prefill"]
  rows = [("jaxrl_llm sampler", ours["total"], tokens / ours["total"],
           f"{ours['prefill']:.3f}", f"{decode:.3f}", f"{tokens / decode:,.0f}", f"{ours['compile']:.2f}")]
  if not args.no_hf:
    hf_total, _ = bench_hf(hf, prompts, args.reps)
    rows.append(("HF transformers generate", hf_total, tokens / hf_total, "-", "-", "-", "-"))
  print(f"\nstandard workload: {P} prompts x {PROMPT_LEN} tokens, G={G}, {NEW} new tokens, "
        f"float32, {os.cpu_count()} CPUs\n")
  print("| sampler | median s/call | tokens/s | prefill s | decode s | decode tokens/s | compile s |")
  print("|---|---|---|---|---|---|---|")
  for name, total, tps, pre, dec, dtps, comp in rows:
    print(f"| {name} | {total:.3f} | {tps:,.0f} | {pre} | {dec} | {dtps} | {comp} |")
  if not args.no_hf:
    print(f"\ntokens/s ratio ours / HF generate: {rows[0][2] / rows[1][2]:.2f}x "
          f"(decode-only tokens/s vs HF's whole call: {(tokens / decode) / rows[1][2]:.2f}x)")


if __name__ == "__main__":
  sys.exit(main())
