"""Experiment trackers: where process 0 sends each metrics row and each rollout table.

`config.logging.trackers` names them (`config.logging_checks.TRACKERS`):

  tensorboard  TensorBoard events in WORKDIR/tb (tensorboardX)
  jsonl        WORKDIR/metrics.jsonl, one JSON object per row
  wandb        a Weights & Biases run (entity, mode, directory: wandb's own WANDB_* variables)
  mlflow       an MLflow run (MLFLOW_TRACKING_URI; MLflow's default is sqlite:///mlflow.db)
  trackio      a trackio run (TRACKIO_DIR; trackio's default is $HF_HOME/trackio)

Each is a small class with one interface: `log(step, row)` takes the row metrics.jsonl
holds, `log_table(step, rows)` a step's rollouts.jsonl rows (`config.logging.rollouts_every`)
and `close()` ends it. The three outside the workdir log into `config.logging.project`
(a wandb project, an MLflow experiment, a trackio project), in a run named after the
workdir; they take the resolved config, flattened, and the run's identity as parameters
(`run_params`), a row's finite numbers as metrics (what TensorBoard plots too), and a step's
rollouts as a table without the aligned token lists (rollouts.jsonl keeps those).

Resume: WORKDIR/trackers.json keeps their run ids and the last step sent to them, and a run
resumed from a checkpoint in the same workdir continues those runs (one that starts from
step 0 opens new ones, as it starts metrics.jsonl anew). A resumed run redoes the steps after
its checkpoint: metrics.jsonl and TensorBoard replace the rows of those steps, but a tracker
run cannot take back what it was sent (wandb refuses a step below its last), so the steps
it already has are not sent again.
"""
from __future__ import annotations

import hashlib
import json
import math
import posixpath
import time
import uuid

from jaxrl_llm import paths
from jaxrl_llm.config import logging_checks

FILE = "trackers.json"
# rollouts.jsonl keeps these aligned lists over every token; a table shows what was said and
# how it scored.
LEFT_OUT_OF_TABLES = ("tokens", "loss_mask", "behaviour_logprobs")


class Jsonl:
  """WORKDIR/metrics.jsonl; a resumed run drops the rows of the steps it redoes."""

  def __init__(self, workdir: str, start_step: int):
    self.path = paths.join(workdir, "metrics.jsonl")
    drop_rows_after(self.path, start_step)

  def log(self, step: int, row: dict) -> None:
    del step  # the row holds it
    paths.append(self.path, json.dumps(row) + "\n")  # one append per row: each row is durable

  def log_table(self, step: int, rows: list[dict]) -> None:
    pass  # rollouts.jsonl is `rollout_log`'s

  def close(self) -> None:
    pass


class TensorBoard:
  """A row's finite numbers as TensorBoard scalars in WORKDIR/tb."""

  def __init__(self, workdir: str, start_step: int):
    import tensorboardX  # pylint: disable=g-import-not-at-top
    # On gs:// tensorboardX re-uploads the whole events object on every flush (objects
    # cannot be appended to), so there it flushes on its own, every flush_secs (120 s)
    # and at close; metrics.jsonl is the record that each row reaches at once.
    self.flush_each_row = not paths.is_remote(workdir)
    # purge_step: TensorBoard hides the older events of the steps this run redoes.
    # gs:// goes through tensorboardX's own writer (google-cloud-storage).
    self.writer = tensorboardX.SummaryWriter(paths.join(workdir, "tb"),
                                             purge_step=start_step + 1 if start_step else 0)

  def log(self, step: int, row: dict) -> None:
    for k, v in numbers(row).items():
      self.writer.add_scalar(k, v, step)
    if self.flush_each_row:
      self.writer.flush()

  def log_table(self, step: int, rows: list[dict]) -> None:
    pass

  def close(self) -> None:
    self.writer.close()


class _Run:
  """A tracker's run outside the workdir. `sent`: the last step the workdir's earlier runs
  sent it (-1: none), which it is not sent again; `ids`: what trackers.json keeps of it."""
  sent: int = -1
  ids: dict

  def log(self, step: int, row: dict) -> None:
    if step > self.sent:
      self._log(step, numbers(row))

  def log_table(self, step: int, rows: list[dict]) -> None:
    if step > self.sent and rows:
      self._log_table(step, *table(rows))


class _RunLog(_Run):
  """A run of a tracker with wandb's interface (`run.log`, `Table`, `run.finish`): wandb's
  and trackio's; `module` is the tracker's."""

  def _log(self, step: int, values: dict) -> None:
    self.run.log(values, step=step)

  def _log_table(self, step: int, columns: list[str], data: list[list]) -> None:
    self.run.log({"rollouts": self.module.Table(columns=columns, data=data)}, step=step)

  def close(self) -> None:
    self.run.finish()


class Wandb(_RunLog):
  """A wandb run, `id=..., resume="allow"` (WANDB_MODE=offline: written under WANDB_DIR)."""

  def __init__(self, name: str, project: str, params: dict, saved: dict):
    import wandb  # pylint: disable=g-import-not-at-top
    self.module = wandb
    self.run = wandb.init(project=project, name=name, config=params, resume="allow",
                          id=saved.get("id"))  # None: a new run, with an id of wandb's
    self.ids = {"id": self.run.id}


class Mlflow(_Run):
  """An MLflow run in the experiment `project`; rollout tables are JSON artifacts
  (rollouts/step_NNNNNN.json: {"columns": [...], "data": [[...], ...]})."""

  def __init__(self, name: str, project: str, params: dict, saved: dict):
    from mlflow import entities  # pylint: disable=g-import-not-at-top
    from mlflow.tracking import MlflowClient  # pylint: disable=g-import-not-at-top
    from mlflow.utils import validation  # pylint: disable=g-import-not-at-top
    self.entities, self.client = entities, MlflowClient()
    if saved:
      self.run_id = saved["run_id"]
      self.client.update_run(self.run_id, status="RUNNING")
    else:
      experiment = self.client.get_experiment_by_name(project)
      experiment_id = (experiment.experiment_id if experiment is not None
                       else self.client.create_experiment(project))
      self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
    self.ids = {"run_id": self.run_id}
    # MLflow's parameters are written once: a resumed run adds only the new ones (its
    # config.json has the values it ran with).
    logged = self.client.get_run(self.run_id).data.params
    self.client.log_batch(self.run_id, params=[
        entities.Param(k, _text(v)[:validation.MAX_PARAM_VAL_LENGTH])
        for k, v in params.items() if k not in logged])

  def _log(self, step: int, values: dict) -> None:
    now = int(time.time() * 1000)
    self.client.log_batch(self.run_id, metrics=[self.entities.Metric(k, float(v), now, step)
                                                for k, v in values.items()])

  def _log_table(self, step: int, columns: list[str], data: list[list]) -> None:
    self.client.log_dict(self.run_id, {"columns": columns, "data": data},
                         f"rollouts/step_{step:06d}.json")

  def close(self) -> None:
    self.client.set_terminated(self.run_id)


class Trackio(_RunLog):
  """A trackio run; trackio resumes a run by its name, so a new one's name ends in a
  random suffix (another workdir of the same name is another run)."""

  def __init__(self, name: str, project: str, params: dict, saved: dict):
    import trackio  # pylint: disable=g-import-not-at-top
    self.module = trackio
    self.run = trackio.init(project=project, name=saved.get("name") or
                            f"{name}-{uuid.uuid4().hex[:8]}", config=params, resume="allow",
                            embed=False)
    self.ids = {"name": self.run.name, "id": self.run.id}


class RunBook:
  """WORKDIR/trackers.json: the run ids of the trackers outside the workdir and the last
  step sent to them, read back by a resumed run (`resumed`). It is a tracker itself, the
  last in the list: a row's step is recorded once every tracker has the row."""

  def __init__(self, workdir: str, resumed: bool):
    self.path = paths.join(workdir, FILE)
    saved = {}
    if resumed and paths.exists(self.path):
      with paths.open(self.path) as f:
        saved = json.load(f)
    self.runs, self.step = saved.get("runs", {}), saved.get("step", -1)

  def log(self, step: int, row: dict) -> None:
    del row
    self.step = max(self.step, step)
    self.save()

  def log_table(self, step: int, rows: list[dict]) -> None:
    pass

  def close(self) -> None:
    pass

  def save(self) -> None:
    paths.write_atomic(self.path, json.dumps({"runs": self.runs, "step": self.step}, indent=2))


LOCAL = {"tensorboard": TensorBoard, "jsonl": Jsonl}  # (workdir, start_step)
REMOTE = {"wandb": Wandb, "mlflow": Mlflow, "trackio": Trackio}  # (name, project, params, saved)


def open_trackers(logging_cfg, workdir: str, start_step: int, params: dict) -> list:
  """The trackers of `config.logging.trackers`, in order; those outside the workdir continue
  the runs trackers.json names if the run resumes (`params`: `run_params`)."""
  names = logging_checks.tracker_names(logging_cfg.trackers)
  trackers = [LOCAL[n](workdir, start_step) for n in names if n in LOCAL]
  remote = [n for n in names if n in REMOTE]
  if not remote:
    return trackers
  book = RunBook(workdir, resumed=start_step > 0)
  name = posixpath.basename(workdir.rstrip("/")) or "run"
  for n in remote:
    saved = book.runs.get(n, {})
    tracker = REMOTE[n](name, logging_cfg.project, params, saved)
    tracker.sent = book.step if saved else -1  # a tracker new to the workdir gets every step
    book.runs[n] = tracker.ids
    trackers.append(tracker)
  book.save()
  return trackers + [book]


def run_params(config, workdir: str, identity: dict) -> dict:
  """The trackers' parameters: the resolved config flattened ('algo.kl.coef': 0.04, ...),
  `run.workdir`, and `run.identity`, a hash of what a checkpoint records as the run's
  identity (`resume.run_identity`: the algorithm and the model)."""
  params = _flatten(json.loads(config.to_json_best_effort()))
  digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
  return {**params, "run.workdir": workdir, "run.identity": digest}


def numbers(row: dict) -> dict[str, float]:
  """A row's finite numbers but its step: what TensorBoard, wandb, mlflow and trackio plot."""
  return {k: v for k, v in row.items()
          if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}


def table(rows: list[dict]) -> tuple[list[str], list[list]]:
  """(columns, data) of rollouts.jsonl rows, less `LEFT_OUT_OF_TABLES`: every field any
  row has, a list or dict as its JSON text."""
  columns = list(dict.fromkeys(k for r in rows for k in r if k not in LEFT_OUT_OF_TABLES))
  return columns, [[_cell(r.get(k)) for k in columns] for r in rows]


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


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict) and v:
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _cell(value):
  return value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(value)


def _text(value) -> str:
  return value if isinstance(value, str) else json.dumps(value)
