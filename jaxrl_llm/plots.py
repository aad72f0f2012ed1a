"""A PNG of a run's curves from its metrics.jsonl (needs matplotlib: `pip install .[demo]`)."""
from __future__ import annotations

import json

from jaxrl_llm import paths


def read_metrics(jsonl_path: str) -> list[dict]:
  with paths.open(jsonl_path) as f:
    return [json.loads(line) for line in f if line.strip()]


def plot_curves(jsonl_path: str, png_path: str, keys: tuple[str, ...], title: str = "") -> None:
  """One panel per key present in the log: value against step."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = read_metrics(jsonl_path)
  keys = tuple(k for k in keys if any(k in r for r in rows))
  fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
  for ax, key in zip(axes[0], keys):
    points = [(r["step"], r[key]) for r in rows if key in r]
    ax.plot([s for s, _ in points], [v for _, v in points], marker="o" if len(points) < 30 else None)
    ax.set_xlabel("step")
    ax.set_title(key)
    ax.grid(alpha=0.3)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  with paths.open(png_path, "wb") as f:  # local or gs://
    fig.savefig(f, format="png", dpi=100)
  plt.close(fig)
