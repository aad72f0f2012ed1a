"""Checks of a config and the run's surroundings that need no model or data: they run
first, so a bad value fails in seconds with a message naming the field, the value and
what was expected, not an hour into a run.
"""
from __future__ import annotations

import os

import jax

from jaxrl_llm import objectives
from jaxrl_llm.training import rollout as rollout_lib
from jaxrl_llm.training import state as state_lib


def validate_config(config, devices=None) -> None:
  """Every check that needs no data or model, before anything is loaded.

  Args:
    config: the full config.
    devices: the devices of the mesh (default: all devices of all processes).
  """
  objectives.validate_algo(config.algo, config.sampling.num_samples)
  state_lib.check_optimizer_config(config.optimizer)
  t, algo, G = config.train, config.algo, config.sampling.num_samples
  positive = {"train.steps": t.steps, "train.prompts_per_step": t.prompts_per_step,
              "train.micro_batch_size": t.micro_batch_size, "sampling.num_samples": G,
              "sampling.max_new_tokens": config.sampling.max_new_tokens,
              "algo.num_iterations": algo.num_iterations,
              "algo.num_minibatches": algo.num_minibatches,
              "train.logprob_chunk_size": t.logprob_chunk_size}
  for name, value in positive.items():
    if int(value) < 1:
      raise ValueError(f"config.{name}={value}: expected a positive integer")
  B = t.prompts_per_step * G
  if B % algo.num_minibatches:
    raise ValueError(f"config.algo.num_minibatches={algo.num_minibatches} does not divide the "
                     f"rollout batch of {B} sequences (train.prompts_per_step x sampling.num_samples)")
  mb = B // algo.num_minibatches
  if mb % min(t.micro_batch_size, mb):
    raise ValueError(f"config.train.micro_batch_size={t.micro_batch_size} does not divide the "
                     f"minibatch of {mb} sequences")
  if config.data.completions not in rollout_lib.COMPLETION_SOURCES:
    raise ValueError(f"config.data.completions={config.data.completions!r}: expected one of "
                     f"{list(rollout_lib.COMPLETION_SOURCES)}")
  if t.prompts_per_step % jax.process_count():
    raise ValueError(f"config.train.prompts_per_step={t.prompts_per_step} is not divisible by the "
                     f"{jax.process_count()} processes")


def check_writable(workdir: str) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, ".write_test")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ValueError(f"workdir {workdir!r} cannot be written: {e}") from e
