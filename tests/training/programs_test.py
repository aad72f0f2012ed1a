"""The jitted steps of a run: where their inputs and outputs live (8 CPU devices), the model
FLOPs behind `mfu`, and which metrics reach the host."""
import json
import os
from unittest import mock

import jax
import numpy as np
import pytest
from absl.testing import absltest
from jax.sharding import NamedSharding, PartitionSpec as P

from configs import gspo, smoke
from jaxrl_llm import training
from jaxrl_llm.training import flops, prepare, rollouts, setup as setup_lib

ROWS = P(("data", "fsdp"))  # the batch rule: rows over data x fsdp


def _gspo_on_eight_devices():
  config = gspo.get_config("runlocal")
  config.train.prompts_per_step, config.sampling.num_samples = 8, 4  # 32 rows
  config.algo.num_minibatches = 4  # GSPO's: minibatches of 8 rows, 2 per batch shard
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  return config


def _rollout(config, S0=16):
  s, P_ = config.sampling, config.train.prompts_per_step
  B, N = P_ * s.num_samples, s.max_new_tokens
  rng = np.random.RandomState(0)
  lengths, truncated = np.full(B, N, np.int32), np.zeros(B, bool)
  return rollouts.Rollout(
      prompt_tokens=rng.randint(5, 50, (P_, S0)).astype(np.int32),
      prompt_mask=np.ones((P_, S0), np.int32), tokens=rng.randint(5, 50, (B, N)).astype(np.int32),
      mask=np.ones((B, N), np.int32), logprobs=np.full((B, N), -3.0, np.float32),
      lengths=lengths, truncated=truncated, rewards=rng.rand(B).astype(np.float32),
      group_valid=np.ones(P_, bool), position=0, prompts=[""] * P_, completions=[],
      stats=rollouts.RolloutStats(lengths, truncated, np.zeros(1)))


class ShardingTest(absltest.TestCase):

  @pytest.mark.mesh
  def test_minibatches_and_step_inputs_keep_the_batch_sharding(self):
    config = _gspo_on_eight_devices()
    setup = training.set_up(config, training.make_plan(config))
    m, programs = setup.models, setup.programs
    arrays = prepare.batch_arrays(_rollout(config), config.sampling.num_samples, False)
    batch, _, _ = programs.prepare(prepare.place_batch(arrays, m.mesh, m.rules), m.policy,
                                   m.reference, m.value, m.teacher, None)
    for name, x in batch.fields().items():
      self.assertEqual(x.sharding.spec, ROWS, name)
    idx = np.random.RandomState(1).permutation(32)[:programs.minibatch_rows]
    minibatch = programs.take_rows(batch, idx)
    for name, x in minibatch.fields().items():
      self.assertEqual(x.shape[0], 8, name)
      self.assertEqual(x.sharding, NamedSharding(m.mesh, ROWS), name)
      self.assertEqual(x.addressable_shards[0].data.shape[0], 2, name)  # 8 rows over 4 shards
      np.testing.assert_array_equal(np.asarray(x), np.asarray(getattr(batch, name))[idx], err_msg=name)
    # The compiled update takes the minibatch as it lies, and the parameters as placed.
    state = setup_lib.fresh_state(setup, config.seed)
    compiled = programs.policy_update.lower(state, minibatch, m.base).compile()  # no LoRA: None
    state_in, batch_in, _ = compiled.input_shardings[0]
    for name, sharding in batch_in.fields().items():
      self.assertTrue(sharding.is_equivalent_to(NamedSharding(m.mesh, ROWS), 2), name)
    qkv_in = state_in.policy_params["layers"]["attn"]["qkv_proj"]["kernel"]
    self.assertTrue(qkv_in.is_equivalent_to(
        state.policy_params["layers"]["attn"]["qkv_proj"]["kernel"].sharding, 5))


class ThroughputTest(absltest.TestCase):

  @pytest.mark.mesh
  def test_mfu_is_the_step_flops_over_time_and_peak(self):
    config = smoke.get_config()
    config.train.peak_flops_per_device = 1e9
    workdir = self.create_tempdir().full_path
    training.train(config, workdir, devices=jax.devices()[:2])
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    s = config.sampling
    for row in rows:
      S0 = s.prompt_buckets[0]
      work = flops.step_flops(
          setup_lib.model_config(config.model), config.algo, prompts=config.train.prompts_per_step,
          samples=s.num_samples, prompt_len=S0, new_tokens=s.max_new_tokens,
          generated=row["response_length_mean"] * config.train.prompts_per_step * s.num_samples,
          reference=True, value=False, recompute_old_logp=False)
      self.assertAlmostEqual(row["mfu"], work["total"] / row["step_time_s"] / 2e9, places=6)
      self.assertAlmostEqual(row["update_mfu"], work["update"] / row["update_time_s"] / 2e9,
                             places=6)

  def test_update_metrics_reach_the_host_on_logged_steps_only(self):
    config = smoke.get_config()
    config.train.steps, config.train.log_every = 5, 2
    fetched = []  # the update-metric names each device_get brought to the host, by call
    original = jax.device_get

    def device_get(tree):
      names = {k for d in tree for k in d} if isinstance(tree, list) and tree and isinstance(
          tree[0], dict) else set()
      fetched.append(names)
      return original(tree)

    workdir = self.create_tempdir().full_path
    with mock.patch.object(jax, "device_get", device_get):
      training.train(config, workdir)
    with_loss = [names for names in fetched if "loss" in names]
    self.assertLen(with_loss, 3)  # steps 2, 4 and 5 (the last); never 1 or 3
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    self.assertEqual([r["step"] for r in rows], [2, 4, 5])


if __name__ == "__main__":
  absltest.main()
