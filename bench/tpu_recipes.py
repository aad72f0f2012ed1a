r"""Every TPU recipe compiled by XLA:TPU for its slice (`launch.compile`), one table: the
peak HBM per chip of each program, the share of HBM left, the step's roofline and the MFU
bound it implies. Compile only: runs on any host with `pip install -e '.[tpu]'`.

  .venv/bin/python bench/tpu_recipes.py                      # every recipe (~45 min, 2 cores)
  .venv/bin/python bench/tpu_recipes.py qwen3_8b_gsm8k       # some

Each recipe runs `python -m launch.compile --config=RECIPE --margin=0.1` in a subprocess;
the rows come from its last line (JSON), and its whole report is saved beside the table in
bench/results/tpu_recipes/ (with --out).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from configs import TPU_RECIPES  # noqa: E402


def compile_recipe(recipe: str, out_dir: str | None) -> tuple[dict, float]:
  """launch.compile's JSON line for `recipe` and the seconds it took."""
  t = time.perf_counter()
  run = subprocess.run([sys.executable, "-m", "launch.compile", f"--config={recipe}",
                        "--margin=0.1"], cwd=REPO, capture_output=True, text=True)
  seconds = time.perf_counter() - t
  if out_dir:
    with open(os.path.join(out_dir, recipe.replace(":", "_").replace(",", "_") + ".txt"),
              "w") as f:
      f.write(run.stdout + run.stderr)
  lines = run.stdout.strip().splitlines()
  if run.returncode not in (0, 3) or not lines:
    raise RuntimeError(f"{recipe}: launch.compile exited {run.returncode}: {run.stderr[-2000:]}")
  return json.loads(lines[-1]), seconds


def _step(result: dict) -> str:
  """The step roofline and MFU bound cells; none where XLA:TPU refused a program."""
  if result["step_roofline_s"] is None:
    return "- | -"
  return f"{result['step_roofline_s']:.3g} | {100 * result['mfu_bound']:.1f}%"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("recipes", nargs="*", default=TPU_RECIPES)
  parser.add_argument("--out", default="", help="a directory for each recipe's whole report")
  args = parser.parse_args()
  if args.out:
    os.makedirs(args.out, exist_ok=True)
  print("| recipe | slice | peak GiB per chip: sampler (or turn) | eval sampler | prepare | "
        "policy update | value update | HBM left | step roofline s | MFU bound | fits with 10% |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for recipe in args.recipes:
    result, seconds = compile_recipe(recipe, args.out)
    programs = result["programs"]
    cell = lambda *names: next((f"{programs[n]['peak_bytes'] / 2**30:.1f}" for n in names
                                if n in programs), "-")
    most = max(p["peak_bytes"] for p in programs.values())
    print(f"| {recipe} | {result['topology']} | {cell('sampler', 'turn')} | "
          f"{cell('eval_sampler')} | {cell('prepare')} | {cell('policy_update')} | "
          f"{cell('value_update')} | {100 * (1 - most / result['hbm_bytes']):.0f}% | "
          f"{_step(result)} | "
          f"{'yes' if result['fits'] else 'NO'} |", flush=True)
    print(f"  ({recipe}: compiled in {seconds:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
  main()
