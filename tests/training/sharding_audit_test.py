"""Where the bytes of a run live on 8 CPU devices: every sizeable array of the train state
(parameters and optimizer moments of the policy and the critic), of the reference and of
the sampler's KV cache holds at most its share per device; an update and a checkpoint
round trip keep that layout."""
import jax
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from configs import grpo, gspo, ppo
from jaxrl_llm import checkpoints, sampling, training
from jaxrl_llm.training import prepare, setup as setup_lib
from jaxrl_llm.training import state as state_lib
from tests.training.programs_test import _rollout

pytestmark = pytest.mark.mesh  # every test here audits arrays sharded over the 8-device mesh

PRESETS = {"grpo": grpo, "ppo": ppo, "gspo": gspo}
MESHES = {"fsdp8": dict(data=1, fsdp=8, tensor=1), "fsdp4_tensor2": dict(data=1, fsdp=4, tensor=2)}
MIN_BYTES = 4096  # smaller arrays (norm scales, the value head, counters) may replicate


def set_up(config):
  """(the run's set-up, a fresh state)."""
  setup = training.set_up(config, training.make_plan(config))
  return setup, setup_lib.fresh_state(setup, config.seed)


def config_on(preset: str, mesh: dict):
  config = PRESETS[preset].get_config("runlocal")
  config.mesh.update(**mesh)
  config.train.prompts_per_step = 8 // config.sampling.num_samples * 2  # 8 or 16 rows
  config.algo.num_minibatches = 1
  return config


def oversized(tree, devices: int) -> list[str]:
  """The arrays of `tree` above MIN_BYTES that hold more than 1/`devices` of their bytes on
  some device, as 'path shape spec: bytes on a device / total'."""
  found = []
  for path, x in jax.tree_util.tree_leaves_with_path(tree):
    if x.nbytes < MIN_BYTES:
      continue
    largest = max(shard.data.nbytes for shard in x.addressable_shards)
    if largest * devices > x.nbytes:
      found.append(f"{jax.tree_util.keystr(path)} {x.shape} {x.sharding.spec}: "
                   f"{largest} of {x.nbytes} bytes on one device")
  return found


def sampler_cache(config, policy):
  """The KV cache the sampler keeps for this config's rollout batch (allocated, not run)."""
  s = config.sampling
  sampler = sampling.Sampler(sampling.SamplingSettings(
      s.num_samples, s.max_new_tokens, layer_loop=s.layer_loop), s.prompt_buckets)
  sampler.lower(policy, [[3, 4, 5]] * config.train.prompts_per_step)
  return sampler.cache


class AuditTest(parameterized.TestCase):

  @parameterized.product(preset=list(PRESETS), mesh=list(MESHES))
  def test_every_large_array_holds_its_share(self, preset, mesh):
    config = config_on(preset, MESHES[mesh])
    setup, state = set_up(config)
    m = setup.models
    self.assertEqual(m.mesh.size, 8)
    arrays = {"state": state, "reference": m.reference and m.reference.params,
              "kv_cache": sampler_cache(config, m.policy)}
    self.assertNotEmpty(jax.tree.leaves(arrays["state"].policy_opt))
    if preset == "ppo":  # a critic with its own moments
      self.assertIsNotNone(arrays["state"].value_opt)
    if preset == "grpo":  # a KL term: a frozen reference (GSPO has neither)
      self.assertIsNotNone(arrays["reference"])
    for name, tree in arrays.items():
      self.assertEqual(oversized(tree, 8), [], name)

  def test_the_audit_finds_a_replicated_moment(self):
    config = config_on("grpo", MESHES["fsdp8"])
    setup, state = set_up(config)
    mu = state.policy_opt[1][0].mu
    replicated = jax.device_put(mu["embed"], jax.sharding.NamedSharding(
        setup.models.mesh, jax.sharding.PartitionSpec()))
    self.assertLen(oversized({"mu": {"embed": replicated}}, 8), 1)
    self.assertEqual(oversized(mu, 8), [])


class LayoutTest(parameterized.TestCase):

  @parameterized.parameters("grpo", "ppo")
  def test_an_update_and_a_checkpoint_keep_the_layout(self, preset):
    config = config_on(preset, MESHES["fsdp4_tensor2"])
    setup, state = set_up(config)
    m, programs = setup.models, setup.programs
    want = state_lib.shardings_of(setup.layout)
    same = lambda state: jax.tree.leaves(jax.tree.map(
        lambda x, s: x.sharding.is_equivalent_to(s, x.ndim), state, want))
    self.assertTrue(all(same(state)))
    arrays = prepare.batch_arrays(_rollout(config), config.sampling.num_samples, False)
    batch, _, _ = programs.prepare(prepare.place_batch(arrays, m.mesh, m.rules), m.policy,
                                   m.reference, m.value, m.teacher, None)
    state, _ = programs.update(state, batch, np.random.default_rng(0))
    self.assertTrue(all(same(state)))
    self.assertEqual(oversized(state, 8), [])

    ckpt = checkpoints.Checkpointer(self.create_tempdir().full_path, config.checkpoint)
    ckpt.save(1, state, {"step": 1})
    ckpt.wait()
    restored, meta = ckpt.restore(1, setup.layout)
    ckpt.close()
    self.assertEqual(meta, {"step": 1})
    self.assertTrue(all(same(restored)))
    for got, saved in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(saved))


if __name__ == "__main__":
  absltest.main()
