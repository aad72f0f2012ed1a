"""`launch.train`, except that committing checkpoint PAUSE_STEP hangs: a window to kill in.

orbax writes a checkpoint into a temporary directory and commits it by renaming it to
the step's name. This wrapper holds that commit open for the step named by the
environment variable PAUSE_STEP, after every file of it is written, and touches the
file PAUSE_MARKER so a test knows the process is now in the middle of a checkpoint
write and can SIGKILL it there.

  PAUSE_STEP=4 PAUSE_MARKER=/tmp/m python -m tests.training.pausing_train --config=... --workdir=...
"""
import os
import time

from orbax.checkpoint._src.path import atomicity

from launch import train

_commit = atomicity.AtomicRenameTemporaryPath.finalize


async def _finalize_or_hang(self):
  if self.get_final().name == os.environ["PAUSE_STEP"]:
    with open(os.environ["PAUSE_MARKER"], "w") as f:
      f.write(str(self.get()))
    while True:
      time.sleep(1)
  return await _commit(self)


atomicity.AtomicRenameTemporaryPath.finalize = _finalize_or_hang

if __name__ == "__main__":
  train.run()
