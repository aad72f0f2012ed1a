"""Every TPU recipe names its slice, and validates on that slice's chips and hosts: its mesh
lays over them, its batch splits over its batch shards and its hosts, and its sharded
dimensions divide. (Whether each fits is `launch.compile`'s, README "Compiled for TPU":
minutes per recipe, so not run here.)"""
import importlib.util

import jax
from absl.testing import absltest, parameterized

from configs import TPU_RECIPES
from jaxrl_llm import config as config_lib
from jaxrl_llm import sharding as sh
from jaxrl_llm import training
from jaxrl_llm.aot import chips, report

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None



@absltest.skipUnless(HAS_LIBTPU, "the TPU compiler (pip install -e '.[tpu]') is not installed")
class TpuRecipesTest(parameterized.TestCase):

  @parameterized.parameters(*TPU_RECIPES)
  def test_validates_on_its_slice(self, spec):
    config = report.for_compiling(config_lib.preset(spec))
    self.assertTrue(config.mesh.topology, "a TPU recipe names its slice")
    devices = chips.topology_devices(config.mesh.topology, config.mesh.num_slices)
    config_lib.validate(config, devices)
    setup = training.set_up(config, training.make_plan(config), devices, abstract=True)
    mesh = setup.models.mesh
    hosts = len({d.process_index for d in devices})
    self.assertEqual(config.train.prompts_per_step % hosts, 0)
    # Every parameter of 64 MiB or more is split: its sharded dimensions divide.
    frozen = None if setup.models.reference is None else setup.models.reference.params
    whole = [x.shape for x in jax.tree.leaves((setup.layout.policy_params, frozen))
             if x.size * x.dtype.itemsize >= 2**26 and x.sharding.shard_shape(x.shape) == x.shape]
    self.assertEqual(whole, [], f"{spec}: parameters held whole on every chip")
    self.assertEqual(mesh.size + config.mesh.rollout_devices, len(devices))

  def test_multislice_recipe_spans_two_slices_on_the_data_axis(self):
    config = report.for_compiling(config_lib.preset("qwen3_8b_gsm8k:tpu_v5p_32x2"))
    devices = chips.topology_devices(config.mesh.topology, config.mesh.num_slices)
    mesh = sh.make_mesh(config.mesh, devices)
    self.assertEqual(dict(mesh.shape), {"data": 2, "fsdp": 16, "expert": 1, "context": 1,
                                          "tensor": 1})
    for i, row in enumerate(mesh.devices):
      self.assertEqual({d.slice_index for d in row.flat}, {i})  # fsdp stays within a slice


if __name__ == "__main__":
  absltest.main()
