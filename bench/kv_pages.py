"""The continuous engine with a page pool below every slot's worst case
(`config.sampling.kv_pages`): the pool's bytes, the most pages in use, the preemptions and
the time per call, at fractions of the worst case, on one workload in one process.

Workload: bench/sampler.py's standard tiny Llama (4 layers, hidden 256, 2 KV heads of 64,
float32, random init) and its `--lengths` schedules: 32 prompts of 32 tokens x G = 8 (256
completions), up to 512 new tokens through per-completion budgets; `longtail`: 90% end
between 16 and 64 tokens, 10% run to 512; `uniform`: all 512. One engine on one XLA CPU
device, its default slots (half the completions: 128) and pages of 32 tokens, so the worst
case is 128 x 16 = 2048 own pages. Every fraction's call must give the whole pool's tokens
for the same seed (checked: a preempted request is recomputed with the same keys).

  .venv/bin/python bench/kv_pages.py                       # longtail, 1 0.5 0.3 0.2
  .venv/bin/python bench/kv_pages.py --lengths uniform --fractions 1,0.5

Printed: a table (medians over `--reps` timed calls after a first, compiling one).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))
sys.path.insert(0, BENCH)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

import sampler as standard  # noqa: E402  (bench/sampler.py: the model and the schedules)


def _model():
  """bench/sampler.py's standard model, random init, saved and loaded as ours."""
  import torch
  import transformers
  from jaxrl_llm import models
  torch.manual_seed(0)
  hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      **standard.MODEL, bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
  path = tempfile.mkdtemp()
  hf.save_pretrained(path)
  return models.from_pretrained(path)


def measure(model, lengths: str, fraction: float, reps: int) -> dict:
  """One pool size: the first call, then `reps` timed calls (seeds 1, 2, ...)."""
  import jax
  from jaxrl_llm import sampling
  from jaxrl_llm.sampling import continuous, page_pool
  budgets = standard._schedule(lengths)  # pylint: disable=protected-access
  prompts = standard._long_prompts()  # pylint: disable=protected-access
  settings = sampling.SamplingSettings(num_samples=standard.G, max_new_tokens=standard.LONG_N,
                                       temperature=1.0, engine="continuous")
  worst = page_pool.own_pages(settings, continuous.engine_slots(settings, len(budgets)))
  one = -(-settings.max_new_tokens // settings.page_size)
  kv_pages = 0 if fraction >= 1 else max(one, round(worst * fraction))
  sampler = sampling.Sampler(sampling.SamplingSettings(
      num_samples=standard.G, max_new_tokens=standard.LONG_N, temperature=1.0,
      engine="continuous", kv_pages=kv_pages))
  run = lambda seed: jax.device_get(sampler(model, prompts, seed, budgets))
  t0 = time.perf_counter()
  run(0)
  first = time.perf_counter() - t0
  times, tokens, stats = [], None, []
  for seed in range(1, reps + 1):
    t0 = time.perf_counter()
    out = run(seed)
    times.append(time.perf_counter() - t0)
    assert np.array_equal(out.lengths, budgets), "the schedule was not followed"
    tokens = out.tokens if tokens is None else tokens
    stats.append({k: int(v) for k, v in sampler.stats.items()})
  pool = sampler.cache if isinstance(sampler.cache, dict) else sampler.cache[0]
  page_bytes = sampler.kv_bytes() // pool["pages_k"].shape[-4]
  return dict(fraction=fraction, kv_pages=kv_pages or worst, pool=sampler.kv_bytes(),
              peak=max(s["peak_pages"] for s in stats) * page_bytes,
              preemptions=statistics.median(s["preemptions"] for s in stats),
              steps=statistics.median(s["steps"] for s in stats), first=first,
              total=statistics.median(times), useful=int(budgets.sum()), tokens=tokens)


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--lengths", default="longtail", choices=("longtail", "uniform"))
  ap.add_argument("--fractions", default="1,0.5,0.3,0.2",
                  help="pool sizes as fractions of every slot's worst case, the first 1")
  ap.add_argument("--reps", type=int, default=2)
  args = ap.parse_args()
  fractions = [float(f) for f in args.fractions.split(",")]
  model = _model()
  rows = [measure(model, args.lengths, f, args.reps) for f in fractions]
  for r in rows[1:]:  # same seed, same tokens: restarts change nothing
    assert np.array_equal(r["tokens"], rows[0]["tokens"]), f"{r['fraction']}: tokens differ"
  mib = lambda b: b / 2**20
  print(f"\n{args.lengths}: {standard.LONG_P} prompts x G {standard.G}, up to "
        f"{standard.LONG_N} new tokens, one engine on one CPU device, medians of {args.reps} "
        "calls\n")
  print("| pool (of the worst case) | kv_pages | pool MiB (peak in use) | preemptions | "
        "decode steps | s/call | useful tokens/s | first call s |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['fraction']:.0%} | {r['kv_pages']} | {mib(r['pool']):.0f} "
          f"({mib(r['peak']):.0f}) | {r['preemptions']:.0f} | {r['steps']:.0f} | "
          f"{r['total']:.2f} | {r['useful'] / r['total']:,.0f} | {r['first']:.1f} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
