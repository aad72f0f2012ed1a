"""config.logging.trackers: wandb (offline), MLflow (a local sqlite store) and trackio (a local
directory) get every metrics.jsonl row at its step, the config as parameters and the rollout
tables; a resume continues their runs without sending a step twice; only process 0 logs;
a tracker whose extra is missing is refused before anything loads. No network."""
import glob
import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from unittest import mock

import jax
import pytest
from absl.testing import absltest, parameterized

from configs import smoke
from jaxrl_llm import config as config_lib
from jaxrl_llm import training
from jaxrl_llm.config import logging_checks
from jaxrl_llm.training import metrics as metrics_lib
from jaxrl_llm.training import rollout_log, trackers
from tests.training.run_logs import read_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROJECT = "trackers_test"
ALL = ("tensorboard", "jsonl", "wandb", "mlflow", "trackio")


def small_config(steps):
  """The smoke run on one device, 2 prompts x 4 samples of 8 tokens, no reference model;
  rollout tables at steps 2 and 4, a checkpoint every 2 steps and at the end."""
  config = smoke.get_config()
  config.train.steps = steps
  config.sampling.max_new_tokens = 8
  config.algo.kl.coef = 0.0
  config.logging.trackers = ALL
  config.logging.project = PROJECT
  config.logging.rollouts_every = 2
  return config


def plotted(row):
  """What a tracker is sent of a metrics.jsonl row: its finite numbers but the step."""
  return {k: v for k, v in row.items()
          if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}


def wandb_records(path):
  """The records of a run's .wandb file: a 7-byte header (':W&B', 0xBEE1, version), then
  LevelDB-log blocks of 32 KiB holding chunks (crc32, length, type: 1 whole, 2 first,
  3 middle, 4 last) of `Record` protos."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", data[:7]
  pos, pending = 7, b""
  while pos + 7 <= len(data):
    left = 32768 - pos % 32768
    _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if left < 7 or (n == 0 and kind == 0):  # the zero padding at a block's end
      pos += left
      continue
    chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
    pending = chunk if kind in (1, 2) else pending + chunk
    if kind in (1, 4):
      yield wandb_internal_pb2.Record.FromString(pending)


@pytest.mark.slow("its set-up (charged to the first test) trains a 3-step run with every tracker "
                  "and resumes it to step 4: each tracker's own import and start (W&B offline, "
                  "MLflow's SQLite store, trackio) beside the run's programs")
class TrackersRunTest(absltest.TestCase):
  """A 3-step run with every tracker, killed after step 3's rows but before its checkpoint
  stuck (the checkpoint is removed), resumed to step 4 in the same workdir."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = absltest.get_default_test_tmpdir() + "/trackers_run"
    shutil.rmtree(cls.root, ignore_errors=True)
    cls.workdir = os.path.join(cls.root, "run")
    cls.env = mock.patch.dict(os.environ, {
        "WANDB_MODE": "offline", "WANDB_SILENT": "true",
        **{f"WANDB_{d}_DIR": os.path.join(cls.root, "wandb", d.lower())
           for d in ("CACHE", "CONFIG", "DATA")},
        "WANDB_DIR": os.path.join(cls.root, "wandb"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{cls.root}/mlflow.db",
        "TRACKIO_DIR": os.path.join(cls.root, "trackio")})  # trackio reads it on import
    cls.env.start()
    cls.addClassCleanup(cls.env.stop)
    os.makedirs(os.path.join(cls.root, "wandb"))
    from mlflow.tracking import MlflowClient  # pylint: disable=g-import-not-at-top
    cls.mlflow = MlflowClient()
    # The experiment's artifacts in the temporary folder (MLflow's default: ./mlruns)
    cls.mlflow.create_experiment(PROJECT, artifact_location=os.path.join(cls.root, "artifacts"))
    devices = jax.devices()[:1]
    training.train(small_config(3), cls.workdir, devices=devices)
    cls.first_rows = read_jsonl(cls.workdir)
    with open(os.path.join(cls.workdir, trackers.FILE)) as f:
      cls.first_book = json.load(f)
    shutil.rmtree(os.path.join(cls.workdir, "checkpoints", "3"))  # resumes from step 2
    training.train(small_config(4), cls.workdir, devices=devices)
    cls.rows = read_jsonl(cls.workdir)
    with open(os.path.join(cls.workdir, trackers.FILE)) as f:
      cls.book = json.load(f)
    with open(os.path.join(cls.workdir, rollout_log.FILE)) as f:
      cls.rollouts = [json.loads(line) for line in f]
    # The trackers keep step 3 as the first run sent it (metrics.jsonl: as the resume redid it).
    cls.want = {r["step"]: plotted(r) for r in cls.first_rows + cls.rows[3:]}

  def assert_rows(self, got):
    """`got` {step: {name: value}}: steps 1-4 once each, every value as metrics.jsonl's."""
    self.assertEqual(sorted(got), [1, 2, 3, 4])
    for step, want in self.want.items():
      self.assertEqual({k: got[step].get(k) for k in want}, want, f"step {step}")

  def test_the_logs_and_the_book(self):
    self.assertEqual([r["step"] for r in self.first_rows], [1, 2, 3])
    self.assertEqual([r["step"] for r in self.rows], [1, 2, 3, 4])  # step 3 redone, once
    self.assertEqual(self.book["runs"], self.first_book["runs"])  # the same runs continued
    self.assertEqual(sorted(self.book["runs"]), ["mlflow", "trackio", "wandb"])
    self.assertEqual((self.first_book["step"], self.book["step"]), (3, 4))

  def test_wandb(self):
    files = sorted(glob.glob(os.path.join(self.root, "wandb", "wandb", "offline-run-*",
                                          "run-*.wandb")))
    self.assertLen(files, 2)  # offline, each session writes its own file of the one run
    got, configs, tables, ids = {}, [], {}, set()
    for path in files:
      for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
          ids.add(record.run.run_id)
          self.assertEqual(record.run.project, PROJECT)
          configs.append({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "history":
          values = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item}
          step = record.history.step.num
          self.assertNotIn(step, got)
          got[step] = values
          if "rollouts/_type" in values:
            tables[step] = (values["rollouts/_type"], values["rollouts/nrows"])
    self.assertEqual(ids, {self.book["runs"]["wandb"]["id"]})
    self.assert_rows(got)
    self.assertEqual(tables, {2: ("table-file", 8), 4: ("table-file", 8)})
    self.assertEqual([c["train.steps"] for c in configs], [3, 4])
    self.assertEqual(configs[0]["logging.trackers"], list(ALL))
    self.assertEqual(configs[0]["run.workdir"], self.workdir)
    self.assertLen(configs[0]["run.identity"], 16)

  def test_mlflow(self):
    experiment = self.mlflow.get_experiment_by_name(PROJECT)
    runs = self.mlflow.search_runs([experiment.experiment_id])
    self.assertEqual([r.info.run_id for r in runs], [self.book["runs"]["mlflow"]["run_id"]])
    run_id = runs[0].info.run_id
    got = {}
    for key in self.want[1]:
      for metric in self.mlflow.get_metric_history(run_id, key):
        self.assertNotIn(key, got.setdefault(metric.step, {}), f"step {metric.step} twice")
        got[metric.step][key] = metric.value
    self.assert_rows(got)
    params = runs[0].data.params
    self.assertEqual(params["train.steps"], "3")  # MLflow keeps a parameter's first value
    self.assertEqual(params["algo.kl.coef"], "0.0")
    self.assertEqual(params["run.workdir"], self.workdir)
    self.assertEqual(json.loads(params["logging.trackers"]), list(ALL))
    self.assertEqual(runs[0].info.status, "FINISHED")
    artifacts = [a.path for a in self.mlflow.list_artifacts(run_id, "rollouts")]
    self.assertEqual(artifacts, ["rollouts/step_000002.json", "rollouts/step_000004.json"])
    with open(os.path.join(self.root, "artifacts", run_id, "artifacts", artifacts[0])) as f:
      table = json.load(f)
    rows = [dict(zip(table["columns"], cells)) for cells in table["data"]]
    want = [r for r in self.rollouts if r["step"] == 2]
    self.assertEqual([r["reward"] for r in rows], [r["reward"] for r in want])
    self.assertEqual([json.loads(r["messages"]) for r in rows], [r["messages"] for r in want])
    self.assertNotIn("tokens", table["columns"])  # the token lists stay in rollouts.jsonl

  def test_trackio(self):
    from trackio import sqlite_storage  # pylint: disable=g-import-not-at-top
    storage = sqlite_storage.SQLiteStorage
    name = self.book["runs"]["trackio"]["name"]
    self.assertEqual(storage.get_runs(PROJECT), [name])
    self.assertTrue(name.startswith("run-"), name)
    got, tables = {}, {}
    for entry in storage.get_logs(PROJECT, name):
      if "rollouts" in entry:
        tables[entry["step"]] = entry["rollouts"]["_value"]
      else:
        self.assertNotIn(entry["step"], got)
        got[entry["step"]] = entry
    self.assert_rows(got)
    self.assertEqual(sorted(tables), [2, 4])
    self.assertEqual([r["reward"] for r in tables[4]],
                     [r["reward"] for r in self.rollouts if r["step"] == 4])
    config = storage.get_run_config(PROJECT, name)
    self.assertEqual((config["train.steps"], config["run.workdir"]), (4, self.workdir))


class RunBookTest(absltest.TestCase):

  def test_a_resumed_run_reads_the_book_and_a_fresh_start_does_not(self):
    workdir = self.create_tempdir().full_path
    book = trackers.RunBook(workdir, resumed=False)
    book.runs["wandb"] = {"id": "abc"}
    book.log(3, {"step": 3})
    self.assertEqual(trackers.RunBook(workdir, resumed=True).runs, {"wandb": {"id": "abc"}})
    self.assertEqual(trackers.RunBook(workdir, resumed=True).step, 3)
    self.assertEqual(trackers.RunBook(workdir, resumed=False).runs, {})  # new runs
    self.assertEqual(trackers.RunBook(workdir, resumed=False).step, -1)


class ProcessesTest(absltest.TestCase):

  def test_only_process_zero_opens_trackers(self):
    workdir = self.create_tempdir().full_path
    with mock.patch.object(jax, "process_index", return_value=1):
      writer = metrics_lib.MetricsWriter(workdir, small_config(1).logging, 1)
      writer.write(1, {"loss": 1.0})
      writer.log_table(1, [{"step": 1, "reward": 1.0}])
      writer.close()
    self.assertEqual(writer.trackers, [])
    self.assertEqual(os.listdir(workdir), [])


class ChecksTest(parameterized.TestCase):

  def test_the_command_line_form_is_comma_separated(self):
    # ml_collections reads --config.logging.trackers=tensorboard,jsonl,wandb as one element.
    self.assertEqual(logging_checks.tracker_names(("tensorboard,jsonl,wandb",)),
                     ("tensorboard", "jsonl", "wandb"))
    self.assertEqual(logging_checks.tracker_names(("",)), ())

  @parameterized.parameters(
      (("jsonl", "wandb", "comet"), "'comet' is not a tracker"),
      (("jsonl,jsonl",), "'jsonl' is named twice"))
  def test_bad_names(self, trackers, problem):
    config = small_config(1)
    config.logging.trackers = trackers
    with self.assertRaisesWithLiteralMatch(config_lib.ConfigError, (
        f"config.logging.trackers={trackers!r}: {problem}; expected names from "
        "['tensorboard', 'jsonl', 'wandb', 'mlflow', 'trackio'], each once (on the command "
        "line comma-separated: --config.logging.trackers=tensorboard,jsonl,wandb)")):
      config_lib.validate(config)

  @parameterized.parameters("wandb", "mlflow", "trackio")
  def test_a_missing_extra_is_named(self, name):
    find_spec = importlib.util.find_spec
    hidden = lambda module, *a: None if module == name else find_spec(module, *a)
    with mock.patch("importlib.util.find_spec", hidden):
      with self.assertRaisesWithLiteralMatch(config_lib.ConfigError, (
          f"config.logging.trackers: '{name}' needs the {name} extra: "
          f"pip install 'jaxrl_llm[{name}]'")):
        config_lib.validate(small_config(1))

  def test_a_missing_extra_exits_2_before_anything_loads(self):
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    hide = "import sys; sys.modules['wandb'] = None; from jaxrl_llm import cli; cli.run()"
    run = subprocess.run(
        [sys.executable, "-c", hide, f"--workdir={workdir}", "--config=configs/smoke.py",
         "--config.logging.trackers=tensorboard,jsonl,wandb"], cwd=REPO, capture_output=True,
        text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stderr, "config.logging.trackers: 'wandb' needs the wandb extra: "
                     "pip install 'jaxrl_llm[wandb]'\n")
    self.assertFalse(os.path.exists(workdir))

  def test_the_old_switches_point_to_trackers(self):
    self.assertEqual(config_lib.unknown_key("logging.tensorboard"),
                     "config.logging.tensorboard is not a known key; name 'tensorboard' in "
                     "config.logging.trackers or leave it out, e.g. "
                     "--config.logging.trackers=jsonl")


if __name__ == "__main__":
  absltest.main()
