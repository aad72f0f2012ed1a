"""README's recorded figures, regenerated: the runs behind them, their figures, the date.

  python bench/readme_figures.py                          # every run, then a table
  python bench/readme_figures.py --only=demo,calculator   # some of them
  python bench/readme_figures.py --write                  # and rewrite the marked figures
  python bench/readme_figures.py --keep=/tmp/figs --reuse # read /tmp/figs/NAME/ again, no runs
  make figures                                            # every run, --write

The runs, one after another on the CPU (JAX_PLATFORMS=cpu), each in a process of its own:
  demo        `make demo`'s run (python -m launch.demo: configs/grpo_arithmetic.py, 200 steps)
  notebook    colabs/grpo_quickstart.ipynb top to bottom (the same run, in a Jupyter kernel)
  calculator  the agent demo (python -m launch.demo --task=calculator, 100 steps)
  calculator_agent  the same task played by an agent program through the policy's endpoint
              (configs/grpo_calculator_agent.py, 100 steps), beside the calculator run
  moe         the MoE demo (python -m launch.demo --task=moe: configs/grpo_arithmetic_moe.py,
              200 steps from the shipped MoE warm start)
Each run's figures come from its metrics.jsonl: held-out greedy accuracy (the exact-match
reward, `eval/reward/*_exact`) at every evaluation, and the wall time of the whole run
(start-up and compilation included). `--write` replaces the text between
`<!-- figures:NAME -->` and `<!-- /figures:NAME -->` in README.md and the notebook, so the
recorded figures are the ones a run printed. `bench/recipes.py` makes "Recipes side by side".
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from jaxrl_llm import plots  # pylint: disable=g-import-not-at-top

NOTEBOOK = os.path.join("colabs", "grpo_quickstart.ipynb")
# The command of each run (its workdir appended), or None: the notebook, run by _notebook.
COMMANDS = {
    "demo": ["-m", "launch.demo"],
    "notebook": None,
    "calculator": ["-m", "launch.demo", "--task=calculator"],
    "calculator_agent": ["-m", "launch.train", "--config=configs/grpo_calculator_agent.py"],
    "moe": ["-m", "launch.demo", "--task=moe"],
}
# The MoE table has the dense run beside it: `--only=moe` runs demo too, unless --keep has it.
NEEDS = {"moe": ("demo",), "calculator_agent": ("calculator",)}
MARKED = {"demo": ("README.md",), "notebook": ("README.md", NOTEBOOK),
          "calculator": ("README.md",), "calculator_agent": ("README.md",), "moe": ("README.md",)}


def _notebook(workdir: str) -> str:
  """Runs the quick-start notebook in full (no smoke mode) in a kernel of this interpreter;
  returns the training workdir it printed ("workdir: ...")."""
  import nbclient  # pylint: disable=g-import-not-at-top  (test extras)
  import nbformat  # pylint: disable=g-import-not-at-top
  from ipykernel import kernelspec  # pylint: disable=g-import-not-at-top
  kernelspec.write_kernel_spec(os.path.join(workdir, "kernels", "readme_figures"))
  os.environ.update(JUPYTER_PATH=workdir, JUPYTER_RUNTIME_DIR=os.path.join(workdir, "rt"),
                    IPYTHONDIR=os.path.join(workdir, "ipython"))
  os.environ.pop("JAXRL_NOTEBOOK_SMOKE", None)
  nb = nbformat.read(os.path.join(REPO, NOTEBOOK), as_version=4)
  nbclient.NotebookClient(nb, kernel_name="readme_figures", timeout=1800,
                          resources={"metadata": {"path": workdir}}).execute()
  printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
  return re.search(r"^workdir: (\S+)$", printed, re.M).group(1)


def run(name: str, workdir: str) -> float:
  """Runs `name` afresh into `workdir` (its metrics.jsonl there); returns its wall time in s."""
  shutil.rmtree(workdir, ignore_errors=True)  # a kept run's checkpoints would resume
  os.makedirs(workdir)
  start = time.perf_counter()
  if COMMANDS[name] is None:
    shutil.copy(os.path.join(_notebook(workdir), "metrics.jsonl"), workdir)
  else:
    proc = subprocess.run([sys.executable, *COMMANDS[name], f"--workdir={workdir}"], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f"{name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
  wall = time.perf_counter() - start
  with open(os.path.join(workdir, "load"), "w") as f:  # others' work on the cores slows it
    f.write(f"{os.getloadavg()[1]:.1f}\n")  # the last 5 minutes'
  with open(os.path.join(workdir, "wall_s"), "w") as f:
    f.write(f"{wall:.1f}\n")
  return wall


def _median(values: list) -> float:
  return sorted(values)[len(values) // 2] if values else float("nan")


def figures(workdir: str) -> dict:
  """A finished run's figures: held-out accuracy and valid-call rate by step, medians of a
  step's time and its sampling and update parts, the wall time and the load average."""
  rows = plots.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  def by_step(end):  # the eval reward `eval/reward/*END` at each evaluation
    evals = ((r["step"], [v for k, v in sorted(r.items())
                          if k.startswith("eval/reward/") and k.endswith(end)]) for r in rows)
    return {step: found[0] for step, found in evals if found}
  with open(os.path.join(workdir, "wall_s")) as f, open(os.path.join(workdir, "load")) as g:
    wall, load = float(f.read()), float(g.read())
  median = lambda key: _median([r[key] for r in rows if key in r])
  return dict(accuracy=by_step("_exact"), valid_call=by_step("valid_call"), wall=wall, load=load,
              step_s=median("step_time_s"), sample_s=median("sample_time_s"),
              update_s=median("update_time_s"))


def _clock(seconds: float) -> str:
  minutes, seconds = divmod(round(seconds), 60)
  return f"{minutes}:{seconds:02d}"


def _cores(fig: dict) -> str:
  """The 2 cores, and how busy: a load average above 2 means others' work shared them."""
  return f"2 CPU cores (load average {fig['load']:.1f})"


def _row(label: str, values: dict) -> str:
  return f"| {label} | " + " | ".join(f"{v:.3f}" for v in values.values()) + " |"


def _table(first: str, steps) -> str:
  return (f"| {first} | " + " | ".join(str(s) for s in steps) + " |\n"
          + "|---" * (len(steps) + 1) + "|")


def render(name: str, results: dict, date: str) -> str:
  """The text between `name`'s markers, from the figures of this invocation's runs."""
  fig = results[name]
  acc = fig["accuracy"]
  last = max(acc)
  if name == "demo":
    late = [v for s, v in acc.items() if s >= 60]
    return (f"from {acc[0]:.2f} to {acc[20]:.2f} in 20 steps and {min(late):.2f}-"
            f"{max(late):.2f} from step 60 to {last}, in {_clock(fig['wall'])} on {_cores(fig)}, "
            f"{date}")
  if name == "notebook":
    return (f"{fig['wall'] / 60:.1f} minutes on {_cores(fig)}, {date} (held-out accuracy "
            f"{acc[0]:.3f} at step 0, {acc[last]:.3f} at step {last})")
  if name == "calculator":
    return (f"seed 0, {_cores(fig)}, {date} (`python -m launch.demo --task=calculator`, "
            f"**{_clock(fig['wall'])} wall time** for the {last} steps with {len(acc)} "
            f"evaluations):\n\n{_table('step', list(acc))}\n"
            f"{_row('held-out accuracy', acc)}\n"
            f"{_row('held-out valid-call rate', fig['valid_call'])}\n\n"
            f"A training step is about {fig['step_s']:.1f} s (medians): playing 64 episodes of "
            f"about two model turns, {fig['sample_s']:.1f} s (the tool calls run in a worker "
            f"process), and one update, {fig['update_s']:.1f} s.")
  if name == "calculator_agent":
    env = results["calculator"]
    return (f"seed 0, {_cores(fig)}, {date} (`python -m launch.train "
            f"--config=configs/grpo_calculator_agent.py`, {_clock(fig['wall'])} wall time for "
            f"the {last} steps; the environment's run: {_clock(env['wall'])}):\n\n"
            f"{_table('step', list(acc))}\n"
            f"{_row('agent program, held-out accuracy', acc)}\n"
            f"{_row('agent program, valid-call rate', fig['valid_call'])}\n"
            f"{_row('environment, held-out accuracy', env['accuracy'])}\n\n"
            f"A training step is about {fig['step_s']:.1f} s (medians), {fig['sample_s']:.1f} s "
            f"of it playing the 64 episodes through the endpoint (the environment's: "
            f"{env['step_s']:.1f} s and {env['sample_s']:.1f} s).")
  if name == "moe":
    dense = results["demo"]
    return (f"Seed 0, {_cores(fig)}, {date}, {_clock(fig['wall'])} for the {last} steps "
            f"(`make demo`: {_clock(dense['wall'])}); held-out greedy accuracy on 256 problems, "
            f"every 20 steps:\n\n{_table('steps', list(acc))}\n"
            f"{_row('MoE (8 experts, 4 active), GRPO + replay', acc)}\n"
            f"{_row('dense, `make demo`', dense['accuracy'])}")
  raise ValueError(f"--only: no figure {name!r}; expected one of {', '.join(COMMANDS)}")


def _substitute(text: str, name: str, new: str) -> tuple[str, int]:
  pattern = re.compile(rf"(<!-- figures:{name} -->).*?(<!-- /figures:{name} -->)", re.S)
  return pattern.subn(lambda m: m.group(1) + new + m.group(2), text)


def rewrite(path: str, name: str, new: str, root: str = REPO) -> None:
  """Replaces the text between `name`'s markers in `root`/`path` (README.md or a notebook's
  markdown cells)."""
  full = os.path.join(root, path)
  with open(full, encoding="utf-8") as f:
    text = f.read()
  if path.endswith(".ipynb"):  # the markdown cells' text, the JSON written as Jupyter does
    nb, found = json.loads(text), 0
    for cell in nb["cells"]:
      source, n = _substitute("".join(cell["source"]), name, new)
      cell["source"], found = source.splitlines(keepends=True), found + n
    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
  else:
    text, found = _substitute(text, name, new)
  if not found:
    raise ValueError(f"--write: no <!-- figures:{name} --> markers in {path}")
  with open(full, "w", encoding="utf-8") as f:
    f.write(text)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--only", default=",".join(COMMANDS), help="runs, comma-separated")
  ap.add_argument("--keep", default="", help="workdir of the runs (default: a temporary one)")
  ap.add_argument("--reuse", action="store_true", help="read --keep's runs instead of running")
  ap.add_argument("--write", action="store_true", help="rewrite the marked README figures")
  args = ap.parse_args()
  chosen = [n for n in args.only.split(",") if n]
  for n in chosen:
    if n not in COMMANDS:
      ap.error(f"--only: {n!r} is not one of {', '.join(COMMANDS)}")
  names = [n for n in COMMANDS if n in chosen or any(n in NEEDS.get(m, ()) for m in chosen)]
  if args.reuse and not args.keep:
    ap.error("--reuse: needs --keep=DIR, the runs to read")
  os.environ["JAX_PLATFORMS"] = "cpu"
  root = args.keep or tempfile.mkdtemp(prefix="readme_figures_")
  date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
  print(f"{date}, load average {os.getloadavg()[0]:.1f}, runs in {root}", flush=True)
  results = {}
  for n in names:
    kept = os.path.exists(os.path.join(root, n, "wall_s"))
    if not args.reuse and (n in chosen or not kept):  # a needed run already kept is read
      print(f"{n}: {_clock(run(n, os.path.join(root, n)))}", flush=True)
    results[n] = figures(os.path.join(root, n))
  print("\n| run | wall | load average | held-out accuracy (step: value) | date |\n"
        "|---|---|---|---|---|")
  for n, fig in results.items():
    accuracy = ", ".join(f"{s}: {v:.3f}" for s, v in fig["accuracy"].items())
    print(f"| {n} | {_clock(fig['wall'])} | {fig['load']:.1f} | {accuracy} | {date} |")
  for n in names if args.write else ():
    for path in MARKED[n]:
      rewrite(path, n, render(n, results, date))
      print(f"rewrote {n} in {path}")


if __name__ == "__main__":
  main()
