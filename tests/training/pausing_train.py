"""`jaxrl-llm-train` (`jaxrl_llm.cli`), except that committing checkpoint PAUSE_STEP hangs: a window to kill in.

orbax writes a checkpoint into a temporary directory and commits it by renaming it to
the step's name (on gs://, into the step's directory, committed by a commit_success.txt
written last). This wrapper holds that commit open for the step named by the
environment variable PAUSE_STEP, after every file of it is written, and touches the
file PAUSE_MARKER so a test knows the process is now in the middle of a checkpoint
write and can SIGKILL it there.

  PAUSE_STEP=4 PAUSE_MARKER=/tmp/m python -m tests.training.pausing_train --config=... --workdir=...
"""
import os
import time

from orbax.checkpoint._src.path import atomicity

from jaxrl_llm import cli


def _hang_at_pause_step(commit):
  async def finalize_or_hang(self):
    if self.get_final().name == os.environ["PAUSE_STEP"]:
      with open(os.environ["PAUSE_MARKER"], "w") as f:
        f.write(str(self.get()))
      while True:
        time.sleep(1)
    return await commit(self)
  return finalize_or_hang


# A local directory commits by a rename, a gs:// one by writing commit_success.txt last.
for _cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
  _cls.finalize = _hang_at_pause_step(_cls.finalize)

if __name__ == "__main__":
  cli.run()
