"""Metrics: a progress bar and each logged row to the trackers (`trackers`); process 0 writes.

(The model-FLOP accounting behind `mfu` is in `flops`.)
"""
from __future__ import annotations

import jax
import numpy as np

from jaxrl_llm.training import trackers as trackers_lib


class MetricsWriter:
  """Sends each logged step's row to the trackers of `config.logging.trackers` (by default
  DIR/metrics.jsonl and TensorBoard events in DIR/tb/) and shows it on a progress bar.

  `start_step`: the step a run starts from (a resumed run's checkpoint step); rows of
  later steps left by an interrupted run are dropped. `params`: what the trackers outside
  the workdir record of the run (`trackers.run_params`).
  """

  def __init__(self, workdir: str, logging_cfg, total_steps: int, start_step: int = 0,
               params: dict | None = None):
    self.enabled = jax.process_index() == 0
    self.trackers, self.bar = [], None
    if not self.enabled:
      return
    self.trackers = trackers_lib.open_trackers(logging_cfg, workdir, start_step, params or {})
    # tqdm.auto: a widget in a notebook (Colab, Jupyter with ipywidgets), text elsewhere.
    from tqdm import auto as tqdm_auto  # pylint: disable=g-import-not-at-top
    self.bar = tqdm_auto.tqdm(total=total_steps, initial=start_step, desc="train", unit="step",
                              dynamic_ncols=True)

  def write(self, step: int, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    row = {"step": int(step), **{k: _plain(v) for k, v in sorted(scalars.items())}}
    for tracker in self.trackers:
      tracker.log(step, row)
    if self.bar is not None:
      shown = {k: f"{row[k]:.3g}" for k in ("reward_mean", "loss", "eval/reward_mean") if k in row}
      self.bar.set_postfix(shown, refresh=False)
      self.bar.update(step - self.bar.n)

  def log_table(self, step: int, rows: list[dict]) -> None:
    """A step's rollouts (rollouts.jsonl's rows) to the trackers that keep tables."""
    if self.enabled:
      for tracker in self.trackers:
        tracker.log_table(step, rows)

  def print(self, text: str) -> None:
    if self.enabled:
      (self.bar.write if self.bar is not None else print)(text)

  def close(self) -> None:
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.close()
    for tracker in self.trackers:
      tracker.close()


def _plain(v):
  v = np.asarray(v)
  return v.item() if v.size == 1 else v.tolist()
