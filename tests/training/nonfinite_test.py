"""The non-finite guard: a NaN loss or gradient skips the update, is counted, and stops
the run after `config.train.max_consecutive_skips` skipped steps in a row."""
import json
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from configs import grpo, smoke
from jaxrl_llm import models, training
from jaxrl_llm import sharding as sh
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.training import guards
from jaxrl_llm.training import rollouts
from jaxrl_llm.training import state as state_lib
from jaxrl_llm.training import steps


def tiny_model():
  cfg = ModelConfig(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32,
                    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, rope_theta=10000.0,
                    rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=32)
  mesh = sh.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
  return models.init(cfg, jax.random.PRNGKey(0), mesh=mesh)


def batch(old_logp_value=0.0):
  B, S0, N = 4, 3, 3
  rng = np.random.default_rng(0)
  old_logp = np.full((B, N), -3.0, np.float32)
  old_logp[1, 2] = old_logp_value
  return rollouts.TrainBatch(tokens=jnp.asarray(rng.integers(0, 32, (B, S0 + N)), jnp.int32),
                             attention_mask=jnp.ones((B, S0 + N), jnp.int32),
                             loss_mask=jnp.ones((B, N), jnp.int32),
                             old_logp=jnp.asarray(old_logp),
                             advantages=jnp.asarray(rng.normal(size=(B, N)), jnp.float32))


class PolicyStepTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    config = grpo.get_config()
    model = tiny_model()
    optimizer = state_lib.make_optimizer(config.optimizer, lambda step: 1e-2)
    layout = state_lib.abstract_state(
        optimizer, models.abstract_params(model.config, model.mesh, model.rules))
    self.state = state_lib.init_state(optimizer, model.params, None, 0, layout)
    self.step = jax.jit(lambda state, b: steps.policy_step(
        state, b, model_static=model.replace(params=None), algo=_no_kl(config.algo),
        optimizer=optimizer, temperature=1.0, chunk_size=3, num_micro=2))

  def test_a_finite_batch_updates(self):
    state, metrics = self.step(self.state, batch())
    self.assertEqual(float(metrics["nonfinite_loss"]), 0.0)
    self.assertEqual(float(metrics["nonfinite_grad"]), 0.0)
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state.policy_params,
                         self.state.policy_params)
    self.assertTrue(all(jax.tree.leaves(moved)))

  def test_a_nan_skips_the_update_and_keeps_the_state(self):
    state, metrics = self.step(self.state, batch(old_logp_value=float("nan")))
    self.assertEqual(float(metrics["nonfinite_loss"]), 1.0)
    self.assertEqual(float(metrics["nonfinite_grad"]), 1.0)
    self.assertTrue(np.isnan(float(metrics["loss"])))
    for got, want in zip(jax.tree.leaves((state.policy_params, state.policy_opt)),
                         jax.tree.leaves((self.state.policy_params, self.state.policy_opt))):
      np.testing.assert_array_equal(got, want)

  def test_an_infinite_gradient_alone_is_caught(self):
    # old log-prob -inf: an infinite ratio, whose gradient is not finite.
    state, metrics = self.step(self.state, batch(old_logp_value=-float("inf")))
    self.assertEqual(float(metrics["nonfinite_grad"]), 1.0)
    for got, want in zip(jax.tree.leaves(state.policy_params),
                         jax.tree.leaves(self.state.policy_params)):
      np.testing.assert_array_equal(got, want)


def _no_kl(algo):
  algo = algo.copy_and_resolve_references()
  algo.kl.coef, algo.kl.placement = 0.0, "none"
  return algo


def poisoned_rollouts(steps_to_poison):
  """SampledRollouts.finish with NaN behaviour log-probs on the given (1-based) steps."""
  real = rollouts.SampledRollouts.finish
  calls = []

  def call(self, pending):
    rollout = real(self, pending)
    calls.append(None)
    if len(calls) in steps_to_poison:
      rollout.logprobs = np.where(rollout.mask > 0, np.nan, rollout.logprobs).astype(np.float32)
    return rollout
  return mock.patch.object(rollouts.SampledRollouts, "finish", call)


def read_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


class LoopGuardTest(absltest.TestCase):

  def config(self, steps_, limit):
    config = smoke.get_config()
    config.train.steps = steps_
    config.train.max_consecutive_skips = limit
    config.checkpoint.every = 0
    return config

  def test_a_poisoned_step_is_skipped_counted_and_the_run_goes_on(self):
    workdir = self.create_tempdir().full_path
    with poisoned_rollouts({2}), self.assertLogs(level="WARNING") as logs:
      training.train(self.config(4, limit=1), workdir)
    rows = read_rows(workdir)
    self.assertEqual([r["step"] for r in rows], [1, 2, 3, 4])
    self.assertEqual([r["skipped_steps"] for r in rows], [0, 1, 1, 1])
    self.assertEqual([r["nonfinite_loss"] for r in rows], [0, 1, 0, 0])
    self.assertTrue(all(np.isfinite(r["loss"]) for r in rows if r["step"] != 2))
    self.assertTrue(any("step 2: skipped 1 of 1 updates: non-finite policy loss, policy gradient"
                        in line for line in logs.output), logs.output)

  def test_too_many_skips_in_a_row_stop_the_run(self):
    workdir = self.create_tempdir().full_path
    with poisoned_rollouts({2, 3, 4}), self.assertRaisesRegex(
        guards.NonFiniteError, r"steps 2-4: 3 steps in a row had a non-finite policy loss and "
        r"policy gradient and skipped their updates; config.train.max_consecutive_skips=2 "
        r"allows at most 2\. The parameters have not changed since step 1"):
      training.train(self.config(6, limit=2), workdir)
    rows = read_rows(workdir)
    self.assertEqual([r["step"] for r in rows], [1, 2, 3, 4])
    self.assertEqual(rows[-1]["skipped_steps"], 3)


if __name__ == "__main__":
  absltest.main()
