r"""Long completions on one TPU slice: what the context axis buys, by XLA:TPU's own numbers.

For one model on one fixed slice and one fixed batch (prompts x G rows), this compiles the
sampler, `prepare` and the policy update of configs/qwen3_8b_16k.py's recipe (the long
reasoning axes) at each number of new tokens, with the sequence split over `context`
devices (`config.mesh.context`; fsdp 16 as the recipe's, data the rest of the chips: the
context axis takes the data axis' chips), and prints each program's peak
HBM per chip and roofline and the step's roofline, as `launch.compile` reports them (the
same Python API: `aot.analysis.analyse`; nothing is parsed from text). Compile only: runs
on any host with `pip install -e '.[tpu]'`.

  .venv/bin/python bench/long_context.py                               # 8B, v5p-64 (~25 min)
  .venv/bin/python bench/long_context.py --lengths=32768 --contexts=1,2,4 --json=out.jsonl

The model: Qwen3-8B's shapes (`--model=1.7b` for Qwen3-1.7B's), the long recipes' model,
whose KV cache (144 KiB a token) and update both matter at these lengths. The batch: 16
prompts x G 16 = 256 rows, half configs/qwen3_8b_16k.py's, so that the sampler's cache at
32k still fits a v5p-64 at context 1 and the comparison reaches the longest length.

Each cell is the smallest micro-batch the mesh allows, one row per batch shard (a row's
sequence split over the context chips), so a longer row or a wider context axis
changes the tokens each chip holds, not the number of rows. What the context axis trades:
the update and `prepare` hold 1/context of each row's activations (each sequence padded to
whole 128-token splash blocks per piece); the sampler's rows split over the context chips
as over the data chips (`sharding.sampling_rules`), so it is the same program either way.
The evaluator's sampler is left out (`train.eval_every=0`): it is the sampler's program at
1/G of the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only: never claim a local TPU
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from jaxrl_llm import config as config_lib  # noqa: E402
from jaxrl_llm import training  # noqa: E402
from jaxrl_llm.aot import analysis, chips, report  # noqa: E402

PROGRAMS = ("sampler", "prepare", "policy_update")
GIB = 2 ** 30
# Shapes of each model (configs/qwen3_8b_gsm8k.py, configs/qwen3_gsm8k.py).
ARCHS = {"8b": config_lib.presets.load_module("qwen3_8b_gsm8k").QWEN3_8B,
         "1.7b": config_lib.presets.load_module("qwen3_gsm8k").QWEN3["1.7b"]}


def cell_config(args, new_tokens: int, context: int, num_chips: int):
  """The long-reasoning recipe at `new_tokens` with the sequence over `context` devices,
  fsdp over `args.fsdp` (at most the chips left), data over the rest, one row per batch
  shard in each micro-batch."""
  config = config_lib.preset("qwen3_8b_16k")
  fsdp = min(args.fsdp, num_chips // context)
  data = num_chips // (fsdp * context)
  with config.unlocked():
    config.model.arch.update(ARCHS[args.model])
    config.model.arch.tie_word_embeddings = args.model != "8b"
    config.sampling.max_new_tokens = new_tokens
    config.algo.overlong.cache_len = new_tokens // 5
    config.sampling.num_samples = args.samples
    config.mesh.update(data=data, fsdp=fsdp, expert=1, context=context, tensor=1,
                       topology=args.topology)
    t = config.train
    t.prompts_per_step, t.micro_batch_size, t.eval_every = args.prompts, data * fsdp, 0
    t.logprob_chunk_size = args.logprob_chunk
  return report.for_compiling(config)


def compile_cell(args, new_tokens: int, context: int, devices) -> dict:
  """One cell: per program its peak GiB per chip, whether it fits, and the step's roofline."""
  config = cell_config(args, new_tokens, context, len(devices))
  start = time.perf_counter()
  try:
    config_lib.validate(config, devices)
  except config_lib.ConfigError as e:
    return {"new_tokens": new_tokens, "context": context, "refused": " ".join(str(e).split())}
  plan = training.make_plan(config)
  setup = training.set_up(config, plan, devices, abstract=True)
  result = analysis.analyse(config, plan, setup, args.topology, args.margin, PROGRAMS)
  return {"new_tokens": new_tokens, "context": context,
          "micro_batch": config.train.micro_batch_size,
          "peak_gib": {p.name: p.peak_bytes / GIB for p in result.programs},
          "temp_gib": {p.name: p.temp_bytes / GIB for p in result.programs},
          "fits": {p.name: result.fits(p) for p in result.programs},
          "roofline_s": {p.name: p.roofline_s for p in result.programs},
          "flops": {p.name: p.flops for p in result.programs},
          "hbm_bytes": {p.name: p.bytes_accessed for p in result.programs},
          "refused_by_xla": result.refused,
          "step_roofline_s": None if result.refused else result.step_roofline_s,
          "mfu_bound": None if result.refused else result.mfu_bound,
          "hbm_gib": result.chip.hbm_bytes / GIB,
          "compile_s": time.perf_counter() - start}


def row(cell: dict) -> str:
  """A table row: peaks (marked * where it does not fit; for a program XLA:TPU refused, the
  temporaries its message names and what is resident beside it), rooflines, the step's
  (none when a program was refused: it has no time)."""
  if "refused" in cell:
    return f"| {cell['new_tokens']} | {cell['context']} | refused: {cell['refused']} |"
  refused = cell["refused_by_xla"]
  peak = lambda n: f"{cell['peak_gib'][n]:.1f}" + ("" if cell["fits"][n] else "*")
  time_ = lambda n: "refused" if n in refused else f"{cell['roofline_s'][n]:.3g}"
  step = ("- | -" if refused else
          f"{cell['step_roofline_s']:.3g} | {100 * cell['mfu_bound']:.1f}%")
  return (f"| {cell['new_tokens']:,} | {cell['context']} | {cell['micro_batch']} | "
          f"{peak('sampler')} | {peak('prepare')} | {peak('policy_update')} | "
          f"{time_('sampler')} | {time_('prepare')} | {time_('policy_update')} | {step} | "
          f"{'yes' if all(cell['fits'].values()) else 'no'} |")


def crossover(cells: list[dict]) -> str:
  """Where a context axis above 1 is needed to fit, or makes the step faster."""
  lines = []
  for tokens in sorted({c["new_tokens"] for c in cells}):
    here = [c for c in cells if c["new_tokens"] == tokens and "refused" not in c]
    fitting = [c for c in here if all(c["fits"].values())]
    if not fitting:
      lines.append(f"{tokens:,} new tokens: no context fits")
      continue
    best = min(fitting, key=lambda c: c["step_roofline_s"])
    smallest = min(c["context"] for c in fitting)
    lines.append(f"{tokens:,} new tokens: fits from context {smallest}; fastest step at "
                 f"context {best['context']} ({best['step_roofline_s']:.3g} s)")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="8b", choices=sorted(ARCHS))
  parser.add_argument("--topology", default="v5p:4x4x2", help="the slice (v5p-64: 32 chips)")
  parser.add_argument("--prompts", type=int, default=16)
  parser.add_argument("--samples", type=int, default=16, help="G")
  parser.add_argument("--lengths", default="4096,8192,16384,32768")
  parser.add_argument("--contexts", default="1,2")
  parser.add_argument("--fsdp", type=int, default=16, help="at most (configs/qwen3_8b_16k.py)")
  parser.add_argument("--logprob_chunk", type=int, default=256)
  parser.add_argument("--margin", type=float, default=0.1)
  parser.add_argument("--json", default="", help="append each cell as a JSON line here")
  args = parser.parse_args()
  devices = chips.topology_devices(args.topology, 1)
  print(f"Qwen3-{args.model.upper()} arch, {args.topology} ({len(devices)} chips), "
        f"{args.prompts} prompts x G {args.samples} rows, fits = peak <= "
        f"{100 * (1 - args.margin):g}% of HBM (* : does not; 'refused': XLA:TPU refused to "
        "compile it for want of HBM)\n")
  print("| new tokens | context | micro-batch | peak GiB per chip: sampler | prepare | update | "
        "roofline s: sampler | prepare | update | step roofline s | MFU bound | fits |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  cells = []
  for tokens in (int(n) for n in args.lengths.split(",")):
    for context in (int(c) for c in args.contexts.split(",")):
      cell = compile_cell(args, tokens, context, devices)
      cells.append(cell)
      print(row(cell), flush=True)
      print(f"  (compiled in {cell.get('compile_s', 0):.0f} s)", file=sys.stderr, flush=True)
      if args.json:
        with open(args.json, "a") as f:
          f.write(json.dumps(cell) + "\n")
  print("\n" + crossover(cells))


if __name__ == "__main__":
  main()
