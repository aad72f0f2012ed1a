"""The compiled programs of a step, with where every input and output lives.

Batch rows are sharded over the mesh's batch axes (each minibatch too), parameters and
optimizer state stay in the train state's layout (`state.abstract_state`; the state is
donated), metrics come back replicated and stay on the devices until a step is logged.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from jaxrl_llm import distributed
from jaxrl_llm import models
from jaxrl_llm import sharding as sh
from jaxrl_llm.training import prepare, steps
from jaxrl_llm.training import state as state_lib
from jaxrl_llm.training.plan import Plan


@dataclasses.dataclass
class Programs:
  """The jitted programs of a step, in the order `train` runs them.

  Attributes:
    prepare: (raw batch, policy, reference, value, teacher, baselines) -> (training batch,
      metrics, baselines).
    policy_update: (state, minibatch, base) -> (state, metrics); `base` the frozen
      parameters with LoRA (`setup.Models.base`), else None.
    value_update: (state, minibatch) -> (state, metrics); None without a critic.
    take_rows: (batch, row indices) -> the minibatch of those rows.
    next_step: state -> state with the step counter advanced.
    minibatch_rows: rows per minibatch.
  """
  prepare: Any
  policy_update: Any
  value_update: Any
  take_rows: Any
  next_step: Any
  minibatch_rows: int
  num_minibatches: int
  num_iterations: int

  def update(self, state: state_lib.TrainState, batch, perm_rng: np.random.Generator,
             base=None):
    """Every optimizer update of one step: `num_iterations` passes over the batch, each
    in `num_minibatches` minibatches of shuffled rows (`base`: LoRA's frozen parameters).
    Returns (state, metrics per update)."""
    rows = self.minibatch_rows * self.num_minibatches
    update_metrics = []
    for _ in range(self.num_iterations):
      order = perm_rng.permutation(rows) if self.num_minibatches > 1 else np.arange(rows)
      for i in range(self.num_minibatches):
        minibatch = batch
        if self.num_minibatches > 1:
          minibatch = self.take_rows(batch, order[i * self.minibatch_rows:
                                                  (i + 1) * self.minibatch_rows])
        state, metrics = self.policy_update(state, minibatch, base)
        if self.value_update is not None:
          state, value_metrics = self.value_update(state, minibatch)
          metrics = {**metrics, **value_metrics}
        update_metrics.append(metrics)
    return self.next_step(state), update_metrics


def compile_programs(config, plan: Plan, trained_models, optimizer, layout) -> Programs:
  """Jits every program of a step for `trained_models` (a `setup.Models`) and `layout`."""
  t, s, algo = config.train, config.sampling, plan.algo
  mesh, rules = trained_models.mesh, trained_models.rules
  B = t.prompts_per_step * plan.rows_per_prompt
  placed = lambda model: None if model is None else model.replace(
      params=jax.tree.map(lambda x: x.sharding, model.params))
  state_shardings = state_lib.shardings_of(layout)
  minibatch_rows = B // algo.num_minibatches
  rows, minibatch = (sh.rows_sharding(B, mesh, rules),
                     sh.rows_sharding(minibatch_rows, mesh, rules))
  repl = sh.replicated(mesh)
  micro_rows = min(t.micro_batch_size, minibatch_rows)
  update = lambda fn, model, *frozen, **kw: distributed.compiled_together(jax.jit(
      functools.partial(fn, model_static=model.replace(params=None), algo=algo,
                        optimizer=optimizer, num_micro=minibatch_rows // micro_rows, **kw),
      in_shardings=(state_shardings, minibatch, *frozen), out_shardings=(state_shardings, repl),
      donate_argnums=(0,), compiler_options=models.COMPILER_OPTIONS), fn.__name__)
  m = trained_models
  shardings = lambda tree: None if tree is None else jax.tree.map(lambda x: x.sharding, tree)
  policy, reference, value, teacher = m.policy, m.reference, m.value, m.teacher
  return Programs(
      prepare=jax.jit(functools.partial(prepare.prepare_batch, plan=plan,
                                        num_samples=plan.rows_per_prompt,
                                        temperature=s.temperature,
                                        chunk_size=t.logprob_chunk_size,
                                        num_micro=B // micro_rows),
                      in_shardings=(rows, placed(policy), placed(reference), placed(value),
                                    placed(teacher), repl),
                      out_shardings=(rows, repl, repl), compiler_options=models.COMPILER_OPTIONS),
      policy_update=update(steps.policy_step, policy, shardings(m.base),
                           temperature=s.temperature, chunk_size=t.logprob_chunk_size),
      value_update=None if value is None else update(steps.value_step, value),
      take_rows=jax.jit(lambda batch, idx: jax.tree.map(lambda x: x[idx], batch),
                        in_shardings=(rows, repl), out_shardings=minibatch),
      next_step=jax.jit(steps.next_step, in_shardings=(state_shardings,),
                        out_shardings=state_shardings, donate_argnums=(0,)),
      minibatch_rows=minibatch_rows, num_minibatches=algo.num_minibatches,
      num_iterations=algo.num_iterations)
