"""Metrics: a progress bar, `metrics.jsonl`, TensorBoard events; process 0 writes.

(The model-FLOP accounting behind `mfu` is in `flops`.)
"""
from __future__ import annotations

import json

import jax
import numpy as np

from jaxrl_llm import paths


class MetricsWriter:
  """One JSON object per logged step in DIR/metrics.jsonl, the same scalars in DIR/tb/.

  `start_step`: the step a run starts from (a resumed run's checkpoint step); rows of
  later steps left by an interrupted run are dropped.
  """

  def __init__(self, workdir: str, logging_cfg, total_steps: int, start_step: int = 0):
    self.enabled = jax.process_index() == 0
    self.jsonl = self.tb = self.bar = None
    # On gs:// tensorboardX re-uploads the whole events object on every flush (objects
    # cannot be appended to), so there it flushes on its own, every flush_secs (120 s)
    # and at close; metrics.jsonl is the record that each row reaches at once.
    self.flush_tb_each_row = not paths.is_remote(workdir)
    if not self.enabled:
      return
    if logging_cfg.jsonl:
      self.jsonl = paths.join(workdir, "metrics.jsonl")
      drop_rows_after(self.jsonl, start_step)
    if logging_cfg.tensorboard:
      import tensorboardX  # pylint: disable=g-import-not-at-top
      # purge_step: TensorBoard hides the older events of the steps this run redoes.
      # gs:// goes through tensorboardX's own writer (google-cloud-storage).
      self.tb = tensorboardX.SummaryWriter(paths.join(workdir, "tb"), purge_step=start_step + 1
                                           if start_step else 0)
    # tqdm.auto: a widget in a notebook (Colab, Jupyter with ipywidgets), text elsewhere.
    from tqdm import auto as tqdm_auto  # pylint: disable=g-import-not-at-top
    self.bar = tqdm_auto.tqdm(total=total_steps, initial=start_step, desc="train", unit="step",
                              dynamic_ncols=True)

  def write(self, step: int, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    row = {"step": int(step), **{k: _plain(v) for k, v in sorted(scalars.items())}}
    if self.jsonl:  # one append per row: each logged row is durable (see `paths.append`)
      paths.append(self.jsonl, json.dumps(row) + "\n")
    if self.tb:
      for k, v in row.items():
        if k != "step" and isinstance(v, (int, float)) and np.isfinite(v):
          self.tb.add_scalar(k, v, step)
      if self.flush_tb_each_row:
        self.tb.flush()
    if self.bar is not None:
      shown = {k: f"{row[k]:.3g}" for k in ("reward_mean", "loss", "eval/reward_mean") if k in row}
      self.bar.set_postfix(shown, refresh=False)
      self.bar.update(step - self.bar.n)

  def print(self, text: str) -> None:
    if self.enabled:
      (self.bar.write if self.bar is not None else print)(text)

  def close(self) -> None:
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.close()
    if self.tb:
      self.tb.close()


def drop_rows_after(path: str, step: int) -> None:
  """Keeps the rows of steps 1..`step` (and the step-0 eval only if step > 0).

  A run resumed from the checkpoint of `step` redoes the steps after it; the rows an
  interrupted run wrote for them (and a truncated last line) go, so each step is
  logged once. Rewritten with `paths.write_atomic`: a kill leaves either the old file
  or the new one.
  """
  if not paths.exists(path):
    return
  kept = []
  with paths.open(path) as f:
    for line in f:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        break  # the last line of a killed run
      if step and row.get("step", 0) <= step:
        kept.append(line if line.endswith("\n") else line + "\n")
  paths.write_atomic(path, "".join(kept))


def _plain(v):
  v = np.asarray(v)
  return v.item() if v.size == 1 else v.tolist()
