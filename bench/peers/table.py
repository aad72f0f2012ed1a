"""Prints the peer comparison as one markdown table, from the JSON files run.sh wrote.

  python3 bench/peers/table.py [--results DIR]

One row per stack and round (a round = each benchmark once, one after another):

* step: the median wall time of the measured steps (min-max beside it);
* sample / ref log-probs / update: medians of the phases inside the step, as each
  stack's runner times them (see their docstrings);
* first step: the first step's wall time, compilation included;
* peak RSS: the runner process's peak resident memory;
* others' CPU: cores used by other processes on the machine during the run, on
  average and in the worst second (near 0 means the run had the machine to itself);
* GFLOP/s: the analytic work of a step (workload.flops_per_step, 207 GFLOP) over the
  median step; "of matmul": that against the same round's float32 2048^3 matmul rate
  (matmul_jax.py), the share of the machine the step uses;
* vs TRL / vs tunix (jaxrl_llm rows): the median step over TRL's and tunix's
  median step of the same round; below 1 is faster.

Standard library only, so any python3 runs it.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workload as W  # noqa: E402

ORDER = ("trl_grpo", "trl_grpo_gc", "tunix_grpo", "jaxrl_grpo", "jaxrl_grpo_2dev")
LOADED = 0.2  # others' cores (average) above which a row is marked as measured under load


def label(r: dict) -> str:
  v = r.get("versions", {})
  if r["stack"] == "TRL":
    text = f"TRL {v.get('trl', '?')} (torch {v.get('torch', '?').split('+')[0]})"
    return text + (", grad ckpt" if r.get("gradient_checkpointing") else "")
  if r["stack"] == "tunix":
    return f"tunix {v.get('tunix', '?')} (jax {v.get('jax', '?')})"
  if r["stack"] == "jaxrl_llm":
    n = r.get("devices", 1)
    text = f"jaxrl_llm {v.get('commit') or v.get('jaxrl_llm', '')}, {n} device{'s' if n > 1 else ''}"
    return text + (f" [{' '.join(r['overrides'])}]" if r.get("overrides") else "")
  return r["bench"]


def load(results: str) -> list[dict]:
  rows = []
  for path in sorted(glob.glob(os.path.join(results, "*.json"))):
    with open(path) as f:
      rows.append(json.load(f))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--results", default=W.RESULTS_DIR)
  args = parser.parse_args()
  results = load(args.results)
  if not results:
    sys.exit(f"no results in {args.results}: run bench/peers/run.sh first")

  matmul = {r["round"]: r["gflops"] for r in results if r["stack"] == "jax matmul"}
  runs = [r for r in results if r["stack"] != "jax matmul"]
  step = {(r["bench"], r["round"]): r["step_s"]["median"] for r in runs}
  rank = lambda r: (ORDER.index(r["bench"]) if r["bench"] in ORDER else len(ORDER),
                    r["bench"], r["round"])
  runs.sort(key=rank)

  starts = sorted(r["started_utc"] for r in results)
  print(f"### {W.NAME}: GRPO step, median of {W.MEASURED_STEPS} steps after "
        f"{W.WARMUP_STEPS} warm-up (runs started {starts[0]} .. {starts[-1]})\n")
  print("| stack | round | step s (min-max) | sample s | ref log-probs s | update s | "
        "first step s | peak RSS MiB | others' CPU, cores (avg / max) | GFLOP/s | of matmul | "
        "vs TRL | vs tunix |")
  print("|---" * 13 + "|")
  loaded = []
  for r in runs:
    s, rnd = r["step_s"], r["round"]
    gflops = r["gflop_per_step"] / s["median"]
    peak = matmul.get(rnd)
    ratio = lambda peer: (f"{s['median'] / step[(peer, rnd)]:.2f}x"
                          if r["stack"] == "jaxrl_llm" and (peer, rnd) in step else "")
    phase = lambda key: "-" if r.get(key) is None else f"{r[key]:.2f}"
    load_ = r["load"]
    if load_["others_cores_avg"] > LOADED:
      loaded.append(f"{r['bench']} round {rnd}")
    print(f"| {label(r)} | {rnd} | {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) | "
          f"{phase('sample_s')} | {phase('ref_logprob_s')} | "
          f"{'~' if r.get('update_is_remainder') else ''}{phase('update_s')} | "
          f"{r['first_step_s']:.1f} | {r['peak_rss_mib']:.0f} | "
          f"{load_['others_cores_avg']:.2f} / {load_['others_cores_max']:.2f} | {gflops:.0f} | "
          f"{f'{100 * gflops / peak:.0f}%' if peak else '-'} | {ratio('trl_grpo')} | "
          f"{ratio('tunix_grpo')} |")

  work = W.flops_per_step()
  print("\nfloat32 2048^3 matmul through jax, median GFLOP/s: "
        + (", ".join(f"round {k} {v:.0f}" for k, v in sorted(matmul.items())) or "not run"))
  print(f"Work per step: {work['total'] / 1e9:.0f} GFLOP = generation "
        f"{work['generation'] / 1e9:.1f} + reference forward {work['reference'] / 1e9:.1f} + "
        f"policy forward and backward {work['policy'] / 1e9:.1f} (workload.flops_per_step).")
  short = [f"{label(r)} round {r['round']}: {r['mean_completion_tokens']:.1f}" for r in runs
           if r.get("mean_completion_tokens") and r["mean_completion_tokens"] < W.NEW_TOKENS]
  if short:
    print("Mean completion length below 64 tokens (the sampler stopped rows at EOS): "
          + "; ".join(short) + ".")
  if loaded:
    print(f"\n**Measured under load** (other processes used > {LOADED} cores on average): "
          + ", ".join(loaded) + ". Do not quote these times.")


if __name__ == "__main__":
  main()
