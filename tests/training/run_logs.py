"""Helpers of the run tests: a finished run's metrics and a resume from its step-2 checkpoint."""
import json
import os
import shutil

import numpy as np

from jaxrl_llm import training

# Wall-clock and throughput fields differ run to run; everything else must not.
TIMING = ("step_time_s", "sample_time_s", "reward_time_s", "logprob_time_s", "update_time_s",
          "sample_tokens_per_s", "train_tokens_per_s", "mfu", "update_mfu")


def read_jsonl(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def comparable(row):
  return {k: v for k, v in row.items() if k not in TIMING}


def assert_rows_close(rows, others, rtol, atol):
  """Each row's comparable metrics equal the other run's row's (same steps, in order)."""
  for a, b in zip(rows, others):
    a, b = comparable(a), comparable(b)
    for k in a:
      np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=f"step {a['step']} {k}")


def resume_from_step_two(config, first, second):
  """Trains `config` in `second`, a workdir holding only `first`'s step-2 checkpoint and its
  log rows up to step 2; returns the rows `second` ends with."""
  shutil.copytree(os.path.join(first, "checkpoints", "2"), os.path.join(second, "checkpoints", "2"))
  with open(os.path.join(second, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in read_jsonl(first)[:2])
  training.train(config, second)
  return read_jsonl(second)
