"""Save and restore the TrainState and the run's position with orbax-checkpoint.

A checkpoint of step s holds `state` (every array of the TrainState, restored directly
into its shardings on the current mesh) and `meta` (JSON: the step, the data position,
and a fingerprint of the config parts that shape the state). orbax writes each step into
a temporary directory and renames it when complete (on gs://, where renames are not
atomic, it writes a commit_success.txt last instead), so a run killed mid-write leaves
the previous checkpoint as the latest.

`Reader` reads a workdir's checkpoints without writing anything (`launch.evaluate`: the
policy's parameters alone).
"""
from __future__ import annotations

from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from jaxrl_llm import paths


class Checkpointer:
  """Every `every` steps into `DIR/checkpoints`, keeping the newest `keep`."""

  def __init__(self, workdir: str, ckpt_cfg):
    """`ckpt_cfg`: a validated `config.checkpoint` (`jaxrl_llm.config.validate`)."""
    self.every = int(ckpt_cfg.every)
    self.manager = ocp.CheckpointManager(
        paths.absolute(paths.join(workdir, "checkpoints")),  # gs:// is orbax's own
        options=ocp.CheckpointManagerOptions(
            max_to_keep=int(ckpt_cfg.keep), enable_async_checkpointing=bool(ckpt_cfg.async_write),
            create=True))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def due(self, step: int, last: bool) -> bool:
    return last or (self.every > 0 and step % self.every == 0)

  def save(self, step: int, state, meta: dict[str, Any]) -> None:
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                   meta=ocp.args.JsonSave(meta)), force=True)

  def restore(self, step: int, abstract_state) -> tuple[Any, dict[str, Any]]:
    """Restores `step` into the shapes, dtypes and shardings of `abstract_state`."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored.state, restored.meta

  def read_meta(self, step: int) -> dict[str, Any]:
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()



class Reader:
  """A workdir's checkpoints, read only (`launch.evaluate`): their steps, their `meta`, and
  the parts of their state asked for."""

  def __init__(self, workdir: str):
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)  # orbax warns that a read-only manager is read only
    try:
      self.manager = ocp.CheckpointManager(
          paths.absolute(paths.join(workdir, "checkpoints")),
          options=ocp.CheckpointManagerOptions(read_only=True, create=False,
                                               save_interval_steps=0, max_to_keep=None))
    finally:
      logging.set_verbosity(verbosity)

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def read_meta(self, step: int) -> dict[str, Any]:
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def restore_part(self, step: int, part: dict[str, Any]) -> dict[str, Any]:
    """The state's fields named by `part` ({'policy_params': abstract tree}) restored into
    its shapes, dtypes and shardings; the rest (the optimizer, a critic) is not read."""
    return self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=part, restore_args=ocp.checkpoint_utils.construct_restore_args(part),
        partial_restore=True))).state

  def close(self) -> None:
    self.manager.close()
