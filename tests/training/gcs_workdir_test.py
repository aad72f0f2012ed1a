"""A gs:// workdir end to end, against a local GCS emulator (`tests/gcs_emulator.py`).

The trainer runs as the real command line, with everything on gs://: the workdir
(config.json, metrics.jsonl, TensorBoard events, orbax checkpoints, the export),
`config.model.path` (the shipped warm start, uploaded) and the JSONL prompts. It is
SIGKILLed while checkpoint 4 is being committed, resumed, and must then match, row for
row and parameter for parameter, an uninterrupted run of the same config on local
paths (trained in this process). The export is read back from gs:// with the project's
loader and with transformers. A LoRA run (in this process) writes its adapter to gs://.
Nothing here is about devices: the subprocesses have as many CPU devices as this process
(1 in `make test`).
"""
import json
import os
import shutil
import signal
import tempfile

import jax
import numpy as np
import pytest
from absl.testing import absltest
from safetensors.numpy import load_file

from configs import smoke
from jaxrl_llm import assets, data, models, paths, training
from tests import cli_runs
from tests import gcs_emulator
from tests import xla_flags
from tests.training import reliability_test
from tests.training.loop_test import read_tb_scalars
from tests.training.run_logs import comparable

pytestmark = pytest.mark.slow_file(
    "two starts of the real command line on gs:// (a kill while committing, a resume), a "
    "reference run and a LoRA run, each reading and writing through the GCS emulator")

STEPS, EVERY, PAUSE = 8, 2, 4  # checkpoints at 2, 4 (killed while committing), 6, 8
# A few `a+b=` problems, some with a carry: the warm start gets some of them right, so the
# rewards vary (checked below).
RECORDS = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in (7, 15, 26, 38) for b in (4, 9)]


def flags(model_path, data_path):
  return ("--config=configs/smoke.py", f"--config.train.steps={STEPS}",
          f"--config.checkpoint.every={EVERY}", "--config.checkpoint.keep=2",
          f"--config.model.path={model_path}",
          f"--config.data.source=jsonl:{data_path}")


def flags_config(model_path, data_path, steps=STEPS):
  """The config `flags(model_path, data_path)` give the command line (with `steps`)."""
  config = smoke.get_config()
  config.train.steps = steps
  config.checkpoint.every = EVERY
  config.checkpoint.keep = 2
  config.model.path = model_path
  config.data.source = f"jsonl:{data_path}"
  return config


def start(workdir, log, flag_values, module="launch.train"):
  """The trainer as a child process forked from tests/cli_runs.py's server, pointed at the
  emulator; output appended to `log`."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=reliability_test.ROOT,
             XLA_FLAGS=xla_flags.for_devices(jax.device_count()), **gcs_emulator.ENV)
  return cli_runs.start(module, [f"--workdir={workdir}", *flag_values], stdout=log,
                        append=True, env=env, cwd=reliability_test.ROOT)


def rows(workdir):
  gcs_emulator.fresh_listings()
  path = paths.join(workdir, "metrics.jsonl")
  if not paths.exists(path):
    return []
  return [json.loads(line) for line in paths.read_text(path).splitlines(keepends=True)
          if line.endswith("\n")]


class GcsWorkdirTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    gcs_emulator.start()
    cls.tmp = tempfile.mkdtemp(prefix="gcs_workdir_")
    cls.bucket = f"gs://{gcs_emulator.BUCKET}/gcs_workdir_test"
    with paths.local_staging(paths.join(cls.bucket, "model")) as stage:
      shutil.copytree(assets.path("arithmetic_sft"), stage, dirs_exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in RECORDS)
    paths.write_atomic(os.path.join(cls.tmp, "train.jsonl"), text)
    paths.write_atomic(paths.join(cls.bucket, "data", "train.jsonl"), text)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def test_a_lora_run_writes_its_adapter_and_export_to_gcs(self):
    workdir = paths.join(self.bucket, "lora")
    config = flags_config(paths.join(self.bucket, "model"),
                          paths.join(self.bucket, "data", "train.jsonl"), steps=2)
    config.lora.rank, config.lora.base_quant = 4, "int8"
    training.train(config, workdir)
    gcs_emulator.fresh_listings()
    self.assertEqual(sorted(paths.listdir(paths.join(workdir, "adapter"))),
                     ["adapter_config.json", "adapter_model.safetensors"])
    config = json.loads(paths.read_text(paths.join(workdir, "adapter", "adapter_config.json")))
    self.assertEqual(config["base_model_name_or_path"], paths.join(self.bucket, "model"))
    self.assertTrue(paths.exists(paths.join(workdir, "export", "model.safetensors")))

  @pytest.mark.slow("two starts of the real command line (killed while committing, then "
                    "resumed), each a process tracing and compiling a step's programs, beside "
                    "the reference run in this process")
  def test_killed_and_resumed_on_gcs_matches_a_local_run(self):
    # The run on gs://, killed while checkpoint PAUSE is being committed ...
    workdir = paths.join(self.bucket, "run")
    log = os.path.join(self.tmp, "run.log")
    gcs_flags = flags(paths.join(self.bucket, "model"),
                      paths.join(self.bucket, "data", "train.jsonl"))
    marker = os.path.join(self.tmp, "in_write")
    proc = start(workdir, log, [*gcs_flags, f"--pause_step={PAUSE}", f"--pause_marker={marker}"],
                 module="tests.training.pausing_train")
    # ... alongside the uninterrupted reference, all local, in this process.
    reference = os.path.join(self.tmp, "reference")
    training.train(flags_config(assets.path("arithmetic_sft"),
                                os.path.join(self.tmp, "train.jsonl")), reference)
    reliability_test.wait_for(lambda: os.path.exists(marker), proc,
                              f"the commit of checkpoint {PAUSE}")
    proc.send_signal(signal.SIGKILL)
    self.assertEqual(proc.wait(), -signal.SIGKILL)
    killed = rows(workdir)
    self.assertGreaterEqual(killed[-1]["step"], PAUSE)
    self.assertLess(killed[-1]["step"], STEPS)
    ckpts = paths.join(workdir, "checkpoints")
    # Step PAUSE's files are written but not committed (no commit_success.txt).
    self.assertIn(str(PAUSE), paths.listdir(ckpts))
    self.assertFalse(paths.exists(paths.join(ckpts, str(PAUSE), "commit_success.txt")))
    self.assertTrue(paths.exists(paths.join(ckpts, str(EVERY), "commit_success.txt")))

    # Resumed from checkpoint EVERY, to the end.
    rc, text = reliability_test.finish(start(workdir, log, gcs_flags), log)
    self.assertEqual(rc, 0, text[-3000:])

    # Every step logged once, with the reference's metrics; the same final parameters.
    ref, got = reliability_test.rows(reference), rows(workdir)
    self.assertEqual([r["step"] for r in got], list(range(1, STEPS + 1)))
    self.assertGreater(len({r["reward_mean"] for r in ref}), 1)  # rewards vary
    for a, b in zip(ref, got):
      self.assertEqual(comparable(a), comparable(b), f"step {a['step']}")
    # Resumed from step EVERY, not from scratch nor from the uncommitted PAUSE: the rows
    # up to EVERY are the killed run's own (timings included), the later ones were redone.
    self.assertEqual(got[:EVERY], killed[:EVERY])
    self.assertNotEqual(got[PAUSE - 1]["step_time_s"], killed[PAUSE - 1]["step_time_s"])
    export = paths.join(workdir, "export")
    want = reliability_test.exported(reference)
    have = load_file(os.path.join(paths.local_copy(export), "model.safetensors"))
    self.assertEqual(want.keys(), have.keys())
    for k in want:
      np.testing.assert_array_equal(want[k], have[k], err_msg=k)
    self.assertEqual(json.loads(paths.read_text(paths.join(workdir, "config.json")))["train"]
                     ["steps"], STEPS)
    # TensorBoard events on gs://, flushed every 120 s and at close: the resumed run's file
    # last (the killed run's, if it reached a flush, before it).
    redone = STEPS - EVERY
    tb = read_tb_scalars(workdir)
    self.assertEqual([step for step, _ in tb["loss"][-redone:]], list(range(EVERY + 1, STEPS + 1)))
    np.testing.assert_allclose([v for _, v in tb["reward_mean"][-redone:]],
                               [r["reward_mean"] for r in got[EVERY:]], rtol=1e-6)
    gcs_emulator.fresh_listings()
    self.assertEqual(sorted(paths.listdir(ckpts)), [str(STEPS - EVERY), str(STEPS)])

    # The export loads from gs:// with our loader, and with transformers from its copy.
    model = models.from_pretrained(export)
    ref_model = models.from_pretrained(os.path.join(reference, "export"))
    jax.tree.map(np.testing.assert_array_equal, model.params, ref_model.params)
    tokenizer = data.load_tokenizer(export)
    self.assertEqual(tokenizer.decode(tokenizer.encode("7+9=")), "7+9=")
    import transformers  # pylint: disable=g-import-not-at-top
    hf = transformers.AutoModelForCausalLM.from_pretrained(paths.local_copy(export))
    np.testing.assert_array_equal(hf.model.embed_tokens.weight.detach().numpy(),
                                  want["model.embed_tokens.weight"])


if __name__ == "__main__":
  absltest.main()
