"""README's commands for the Qwen3 recipe and a TPU slice, run as written in a dry run.

`jaxrl-llm-train ... --dry_run` checks the config, the model directory and the data and
prints the plan without loading anything; here $HOME is a temporary directory holding a
tiny random Qwen3 (with a chat template) in place of the downloaded checkpoints and a few
GSM8K-style records in place of launch/prepare_gsm8k.py's output. The TPU block runs with
`launch/tpu_pod.py --dry-run`, which prints the gcloud commands and checks the config.
The `hf download` and `prepare_gsm8k` lines need the network and are left out.
"""
import json
import os
import re
import subprocess
import sys

import pytest
from absl.testing import absltest

from tests.qwen3_gsm8k_config_test import tiny_qwen3
from tests import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)  # the venv's bin: python and jaxrl-llm-train


def readme_block(heading: str) -> str:
  """The first ```bash block after `heading` in README.md."""
  with open(os.path.join(REPO, "README.md")) as f:
    text = f.read()
  after = text[text.index(heading):]
  return re.search(r"```bash\n(.*?)```", after, re.S).group(1)


def commands(block: str, program: str) -> list[str]:
  """The block's commands (continuation lines joined) that run `program`."""
  joined = re.sub(r"\\\n\s*", " ", block)
  return [line.strip() for line in joined.splitlines()
          if program in line and not line.lstrip().startswith("#")]


class ReadmeCommandsTest(absltest.TestCase):

  @pytest.mark.slow("three README commands, each its own `jaxrl-llm-train --dry_run` process "
                    "(the command as a user runs it is what is checked): each start imports "
                    "jax, transformers and the library again")
  def test_qwen3_recipe_commands(self):
    home = self.create_tempdir().full_path
    for size in ("0.6B", "1.7B"):
      tiny_qwen3(os.path.join(home, "models", f"Qwen3-{size}"))
    data = os.path.join(home, "data", "gsm8k")
    os.makedirs(data)
    for split in ("train", "eval"):
      with open(os.path.join(data, f"{split}.jsonl"), "w") as f:
        f.write(json.dumps({"prompt": "Tom has 3 apples and buys 4. How many now?",
                            "answer": "3 + 4 = 7\n#### 7"}) + "\n")
    runs = commands(readme_block("### Real-model recipes"), "jaxrl-llm-train")
    self.assertLen(runs, 2)  # the v5e host and the GPU
    env = dict(os.environ, HOME=home, PATH=f"{BIN}:{os.environ['PATH']}", JAX_PLATFORMS="cpu",
               XLA_FLAGS=xla_flags.for_devices(8))
    for command, dry_run in zip(runs, ("--dry_run", "--dry-run")):  # both spellings
      run = subprocess.run(["bash", "-c", f"{command} {dry_run}"], cwd=home, env=env,
                           capture_output=True, text=True, timeout=300)
      self.assertEqual(run.returncode, 0, f"{command}\n{run.stderr[-3000:]}")
      self.assertIn("dry run: the config, the model directory and the data check out",
                    run.stdout)
      self.assertFalse(os.path.exists(os.path.join(home, "runs")))  # nothing written
    # Without the paths the recipe refuses to start, with one line.
    bare = re.sub(r" --config\.(model\.path|data\.source)=\S+", "", runs[0]) + " --dry_run"
    run = subprocess.run(["bash", "-c", bare], cwd=home, env=env, capture_output=True,
                         text=True, timeout=300)
    self.assertEqual(run.returncode, 2, run.stderr)
    self.assertEqual(run.stderr.strip(), "config.data.source and config.model.path are "
                     "required by this preset: set them, e.g. --config.data.source=...")

  def test_tpu_slice_commands(self):
    block = readme_block("### A Cloud TPU slice")
    launcher = f"{sys.executable} launch/tpu_pod.py --dry-run"
    script = block.replace("python launch/tpu_pod.py", launcher)
    script = script.replace("$TPU --config", "$TPU --nofollow --config")  # no log to follow
    run = subprocess.run(["bash", "-ec", script], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    printed = run.stdout
    for verb in ("queued-resources describe", "scp", "ssh", "queued-resources delete"):
      self.assertIn(verb, printed)
    self.assertIn(".venv/bin/jaxrl-llm-train --multihost "
                  "--config=configs/qwen3_gsm8k.py:tpu_v5p_32,size=1.7b", printed)


if __name__ == "__main__":
  absltest.main()
