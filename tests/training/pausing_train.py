"""`jaxrl-llm-train` (`jaxrl_llm.cli`), except that committing checkpoint --pause_step hangs: a window to kill in.

orbax writes a checkpoint into a temporary directory and commits it by renaming it to
the step's name (on gs://, into the step's directory, committed by a commit_success.txt
written last). This wrapper holds that commit open for the step --pause_step, after every
file of it is written, and writes the path it commits to the file --pause_marker, so that a
test knows the process is now in the middle of a checkpoint write and can SIGKILL it there.

  python -m tests.training.pausing_train --pause_step=4 --pause_marker=/tmp/m --config=... --workdir=...
"""
import time

from absl import flags
from orbax.checkpoint._src.path import atomicity

from jaxrl_llm import cli

PAUSE_STEP = flags.DEFINE_integer("pause_step", None, "the checkpoint whose commit hangs",
                                  required=True)
PAUSE_MARKER = flags.DEFINE_string("pause_marker", None, "the file written once it hangs",
                                   required=True)


def _hang_at_pause_step(commit):
  async def finalize_or_hang(self):
    if self.get_final().name == str(PAUSE_STEP.value):
      with open(PAUSE_MARKER.value, "w") as f:
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
