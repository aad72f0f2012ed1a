"""Every RL preset on the demo's arithmetic task, side by side (configs/arithmetic.py).

  python bench/recipes.py                      # all presets, 100 steps each
  python bench/recipes.py --presets grpo,ppo --steps 50
  python bench/recipes.py --presets grpo,opd --steps 40 --eval_every 10

Each preset runs `launch.train` in its own process (seed 0, same warm start, same 512
rows per step, same optimizer), one after another so that they do not share the cores.
Prints a markdown table: held-out greedy accuracy at every evaluation, the mean train
reward over the last 10 steps, and the wall time of the whole run (start-up and
compilation included).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from configs import arithmetic  # pylint: disable=g-import-not-at-top
from jaxrl_llm import plots  # pylint: disable=g-import-not-at-top


def run(preset: str, steps: int, workdir: str, eval_every: int) -> dict:
  cmd = [sys.executable, "-m", "launch.train",
         f"--config={os.path.join(REPO, 'configs', 'arithmetic.py')}:preset={preset},steps={steps}",
         f"--config.train.eval_every={eval_every}", f"--workdir={workdir}"]
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  wall = time.perf_counter() - start
  if proc.returncode:
    raise RuntimeError(f"{preset} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
  rows = plots.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  # The task's exact-match reward (a mixed preset's sources share the task: the first's).
  accuracy = lambda r: next((v for k, v in sorted(r.items()) if k.startswith("eval/")
                             and k.endswith("reward/arithmetic_exact")), None)
  evals = {r["step"]: accuracy(r) for r in rows if accuracy(r) is not None}
  rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
  return dict(evals=evals, reward=sum(rewards[-10:]) / len(rewards[-10:]), wall=wall)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--presets", default=",".join(arithmetic.PRESETS))
  ap.add_argument("--steps", type=int, default=100)
  ap.add_argument("--eval_every", type=int, default=20)
  args = ap.parse_args()
  presets = args.presets.split(",")
  for p in presets:
    if p not in arithmetic.PRESETS:
      ap.error(f"--presets: {p!r} is not one of {', '.join(arithmetic.PRESETS)}")
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    for p in presets:
      results[p] = run(p, args.steps, os.path.join(tmp, p), args.eval_every)
      print(f"{p}: {results[p]['evals']} reward {results[p]['reward']:.3f} "
            f"{results[p]['wall']:.0f} s", flush=True)
  steps = sorted({s for r in results.values() for s in r["evals"]})
  print(f"\nheld-out greedy accuracy (256 problems) by step; {args.steps} steps, seed 0\n")
  print("| preset | " + " | ".join(str(s) for s in steps) + " | train reward, last 10 | wall s |")
  print("|---|" + "---|" * (len(steps) + 2))
  for p, r in results.items():
    accs = " | ".join(f"{r['evals'][s]:.3f}" if s in r["evals"] else "-" for s in steps)
    print(f"| {p} | {accs} | {r['reward']:.3f} | {r['wall']:.0f} |")


if __name__ == "__main__":
  main()
