"""launch.compile: every program of a step compiled by XLA:TPU for a small slice (compile
only, on this CPU host), with the TPU kernels chosen; its report, JSON line and exit codes.

Tiny models in bf16 at a sequence of 128 (so the training attention is splash's) where
splash is checked, short sequences elsewhere (XLA's attention compiles faster), on
v5e:2x2 (4 chips on one host), except the dense step (`dense_analysis`), compiled once on
v5e:4x4 (16 chips on 4 hosts) for the tests of its report and of several hosts, and the
slices'. Every XLA:TPU compile here is a real one (an update's takes tens of seconds):
JAX's persistent cache cannot read a program compiled without a TPU client back.
"""
import functools
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from absl.testing import absltest

from jaxrl_llm import config as config_lib
from jaxrl_llm import training
from jaxrl_llm.aot import analysis, chips, report, step
from tests import cli_runs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
SPLASH = ("splash_mqa_fwd", "splash_mqa_dkv", "splash_mqa_dq")
COMPILES = ("XLA:TPU compiles a step's programs on this CPU host, an update's for tens of "
            "seconds, and none can be read back from the persistent cache (no TPU client)")
pytestmark = pytest.mark.slow_file(
    "about 20 XLA:TPU compiles in process and 3 launch.compile runs (one --search: 10 more; "
    "forked from tests/cli_runs.py's server but the one fresh interpreter), each the only "
    "check of its recipe: " + COMPILES)


def slow(why: str):
  return pytest.mark.slow(f"{why}: {COMPILES}")


def tiny_tpu_config(preset: str = "grpo", **arch):
  """A tiny bf16 model whose training sequence (64 prompt + 64 new tokens) is splash's."""
  config = config_lib.preset(preset)
  config.model.dtype = "bfloat16"
  config.model.arch.update(hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2,
                           head_dim=128, **arch)
  config.sampling.update(num_samples=4, max_new_tokens=64, max_prompt_len=64,
                         prompt_buckets=(32, 64))
  config.train.update(prompts_per_step=8, micro_batch_size=16, eval_every=0)
  return config


def analyse(config, topology: str = "v5e:2x2", num_slices: int = 1, only: tuple[str, ...] = ()):
  """The step's programs compiled for the slice (`only`: those named; each XLA:TPU compile
  takes seconds, an update's tens of them, and none is cached: a compile without a TPU
  client cannot read JAX's persistent cache back)."""
  devices = chips.topology_devices(topology, num_slices)
  config = report.for_compiling(config)
  config_lib.validate(config, devices)
  plan = training.make_plan(config)
  setup = training.set_up(config, plan, devices, abstract=True)
  return analysis.analyse(config, plan, setup, topology, only=only), setup


def hosts_config():
  """`tiny_tpu_config` with a batch for 16 chips."""
  config = tiny_tpu_config()
  config.train.prompts_per_step = 16
  return config


@functools.cache
def dense_analysis():
  """The tiny dense step on v5e:4x4 (16 chips on 4 hosts), compiled once for the tests
  that read it: the splash kernels, the report's figures and the multi-host program."""
  return analyse(hosts_config(), "v5e:4x4")


def compile_cli(*flags, fresh: bool = False):
  """`python -m launch.compile FLAGS`: forked from tests/cli_runs.py's server (JAX and the
  library imported once), or (`fresh`) in a new interpreter, as one run here checks."""
  if not fresh:
    return cli_runs.run("launch.compile", flags)
  return subprocess.run([sys.executable, "-m", "launch.compile", *flags], cwd=REPO, text=True,
                        capture_output=True, timeout=600)


# Short sequences where splash attention is not what a test checks: below splash's 128
# tokens the attention is XLA's, whose backward compiles in a fraction of splash's time.
SHORT = dict(max_new_tokens=16, max_prompt_len=16, prompt_buckets=(16,))
SHORT_FLAGS = ("--config.sampling.max_new_tokens=16", "--config.sampling.max_prompt_len=16",
               "--config.sampling.prompt_buckets=(16,)")


@absltest.skipUnless(HAS_LIBTPU, "the TPU compiler (pip install -e '.[tpu]') is not installed")
class CompileForTpuTest(absltest.TestCase):

  @slow("the tiny dense step's 3 programs on v5e:4x4 (shared with the hosts test)")
  def test_dense_step_compiles_with_splash_in_training(self):
    result, _ = dense_analysis()
    programs = {p.name: p for p in result.programs}
    self.assertEqual(list(programs), ["sampler", "prepare", "policy_update"])
    update = programs["policy_update"]
    for kernel in SPLASH:  # forward and both backward kernels: TPU's, not the XLA fallback
      self.assertTrue(any(k.startswith(kernel) for k in update.kernels), update.kernels)
    self.assertTrue(any(k.startswith("splash_mqa_fwd") for k in programs["prepare"].kernels))
    for p in result.programs:
      self.assertGreater(p.argument_bytes, 0, p.name)
      self.assertGreater(p.flops, 0, p.name)
      self.assertGreater(p.roofline_s, 0, p.name)
      self.assertTrue(result.fits(p), p.name)
    # Beside the update: the reference and the sampler's kept KV buffers, not the state.
    self.assertEqual(set(update.resident), {"reference", "kv_cache"})
    self.assertEqual(set(programs["sampler"].resident), {"optimizer", "reference"})
    self.assertGreater(result.mfu_bound, 0)
    self.assertLess(result.mfu_bound, 1)

  def test_the_kv_cache_figure_follows_kv_pages(self):
    """launch.compile's KV cache beside the update: one continuous engine per chip (2
    prompts x G 4 in 4 slots, 64 new tokens: 2 pages of 32 each at the limit) keeps its
    prompts' pages, `kv_pages` own pages (0: every slot's 2) and one spare."""
    def kv_cache_bytes(kv_pages):
      config = tiny_tpu_config()
      config.sampling.update(engine="continuous", kv_pages=kv_pages)
      devices = chips.topology_devices("v5e:2x2")
      config = report.for_compiling(config)
      config_lib.validate(config, devices)
      plan = training.make_plan(config)
      setup = training.set_up(config, plan, devices, abstract=True)
      return step.resident_buffers(config, plan, setup)["kv_cache"][1]
    page = 2 * 2 * 2 * 128 * 32 * 2  # layers x (keys, values) x KV heads x head_dim x 32, bf16
    self.assertEqual(kv_cache_bytes(0), (2 * 2 + 4 * 2 + 1) * page)
    self.assertEqual(kv_cache_bytes(5), (2 * 2 + 5 + 1) * page)

  @slow("PPO's 4 programs, its value update with splash's backward kernels")
  def test_ppo_value_update_compiles_with_splash(self):
    result, _ = analyse(tiny_tpu_config("ppo"))
    programs = {p.name: p for p in result.programs}
    self.assertEqual(list(programs), ["sampler", "prepare", "policy_update", "value_update"])
    value = programs["value_update"]
    for kernel in SPLASH:
      self.assertTrue(any(k.startswith(kernel) for k in value.kernels), value.kernels)
    self.assertGreater(value.flops, 0)
    self.assertTrue(result.all_fit)

  @slow("an MoE step's 3 programs with expert parallelism and routing replay")
  def test_moe_with_routing_replay_compiles(self):
    config = tiny_tpu_config(model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=128)
    config.algo.routing_replay = "rollout"
    config.sampling.engine = "static"
    config.mesh.update(data=2, expert=2)
    config.sampling.update(**SHORT)  # no splash: the experts' kernels are what this compiles
    result, setup = analyse(config)
    self.assertEqual([p.name for p in result.programs], ["sampler", "prepare", "policy_update"])
    self.assertTrue(all(result.fits(p) for p in result.programs))
    from jaxrl_llm.aot import step  # pylint: disable=g-import-not-at-top
    plan = training.make_plan(report.for_compiling(config))
    self.assertIsNotNone(step.minibatch(report.for_compiling(config), plan, setup).routing)

  def test_multi_turn_turn_program_compiles_in_the_tpu_cache_layout(self):
    config = config_lib.preset("grpo_calculator")
    # The recipe's programs at smaller shapes (its 64 episodes of 192 tokens a step compile
    # 4x longer): the cache's layout is the same.
    config.sampling.max_new_tokens, config.data.max_episode_tokens = 16, 64
    config.train.update(prompts_per_step=2, micro_batch_size=8)
    result, setup = analyse(config)
    self.assertEqual([p.name for p in result.programs], ["turn", "prepare", "policy_update"])
    self.assertTrue(result.all_fit)
    from jaxrl_llm.aot import step  # pylint: disable=g-import-not-at-top
    turn = next(p for p in step.step_programs(report.for_compiling(config),
                                              training.make_plan(config), setup)
                if p.name == "turn")
    cache = turn.lower().args_info[0][1].cache  # the TurnState's buffers, on one TPU chip
    self.assertIn("k_sd", cache)  # slot-major keys: the TPU's layout, not the host's

  def test_lora_update_takes_the_frozen_base(self):
    config = hosts_config()  # dense_analysis's, with LoRA
    config.lora.update(rank=8, base_quant="int8")
    result, setup = analyse(config, "v5e:4x4", only=("policy_update",))  # what this checks
    update = next(p for p in result.programs if p.name == "policy_update")
    self.assertNotIn("base", update.resident)  # an argument of the update
    self.assertIsNotNone(setup.models.base)
    full, _ = dense_analysis()
    full_update = next(p for p in full.programs if p.name == "policy_update")
    self.assertLess(update.argument_bytes, full_update.argument_bytes)  # adapters + int8 base

  @slow("the multislice step's 3 programs")
  def test_the_global_program_compiles_for_several_hosts_and_slices(self):
    hosts, setup = dense_analysis()  # v5e:4x4: 16 chips on 4 hosts
    self.assertEqual(setup.models.mesh.size, 16)
    self.assertTrue(hosts.all_fit)
    slices, setup = analyse(hosts_config(), "v5e:2x4", num_slices=2)  # 2 slices of 8 chips
    data = setup.models.mesh.devices  # [data, fsdp, expert, context, tensor]
    self.assertEqual({d.slice_index for d in data[: data.shape[0] // 2].flat}, {0})
    self.assertEqual({d.slice_index for d in data[data.shape[0] // 2:].flat}, {1})
    self.assertTrue(slices.all_fit)

  @slow("launch.compile --search (forked): 3 remats x 2 programs, then the step's 4")
  def test_cli_searches_reports_every_program_and_exits_0_when_it_fits(self):
    # 1 prompt x G 4 = 4 rows over 4 batch shards: micro-batch 4, three remats.
    run = compile_cli("--config=grpo", "--topology=v5e:2x2", "--config.model.dtype=bfloat16",
                      "--config.train.eval_every=2", "--config.train.prompts_per_step=1",
                      "--config.sampling.num_samples=4", "--config.train.micro_batch_size=4",
                      *SHORT_FLAGS, "--search")
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    rows = [line for line in run.stdout.splitlines() if line.startswith("| 4")]
    self.assertEqual(len(rows), 3, run.stdout)  # every remat, compiled
    self.assertEqual(sum("(best)" in r for r in rows), 1)
    self.assertIn("fastest that fits: --config.train.micro_batch_size=", run.stdout)
    last = json.loads(run.stdout.strip().splitlines()[-1])
    self.assertEqual(set(last), {"topology", "chip", "hbm_bytes", "programs", "step_roofline_s",
                                 "mfu_bound", "fits"})
    self.assertEqual(last["chip"], "v5e")
    self.assertEqual(list(last["programs"]), ["sampler", "eval_sampler", "prepare",
                                              "policy_update"])
    self.assertTrue(last["fits"])
    self.assertIn("MFU bound", run.stdout)

  @pytest.mark.slow("launch.compile (forked) of an update with 131072 x 4096 embeddings: XLA:TPU "
                    "compiles it on this CPU host, through memory assignment, before refusing it")
  def test_cli_exits_3_naming_the_program_that_does_not_fit(self):
    # 2 x 131072 x 4096 float32 embeddings with their gradients, Adam's moments and the
    # reference, replicated: ~20 GiB a chip, beyond v5e's 16 (XLA:TPU refuses the program).
    run = compile_cli("--config=grpo", "--topology=v5e:2x2", "--config.model.arch.vocab_size=131072",
                      "--config.model.arch.hidden_size=4096", *SHORT_FLAGS,
                      "--programs=policy_update")
    self.assertEqual(run.returncode, 3, run.stderr[-3000:])
    self.assertIn("policy_update does not fit: XLA:TPU refused it", run.stderr)
    self.assertIn("config.mesh.fsdp", run.stderr)  # what to change
    self.assertFalse(json.loads(run.stdout.strip().splitlines()[-1])["fits"])

  def test_cli_exits_2_for_a_bad_topology_or_mesh(self):
    # launch.compile's one run in a fresh interpreter (the others fork from cli_runs' server)
    bad_name = compile_cli("--config=grpo", "--topology=v5e:3x3", fresh=True)
    self.assertEqual(bad_name.returncode, 2)
    self.assertEqual(len(bad_name.stderr.strip().splitlines()), 1, bad_name.stderr)
    self.assertIn("v5e:3x3", bad_name.stderr)
    bad_mesh = compile_cli("--config=grpo", "--topology=v5e:2x2", "--config.mesh.data=1",
                           "--config.mesh.fsdp=3")
    self.assertEqual(bad_mesh.returncode, 2)
    self.assertIn("config.mesh", bad_mesh.stderr)
    self.assertEqual(len(bad_mesh.stderr.strip().splitlines()), 1, bad_mesh.stderr)

  def test_hbm_table_is_the_compilers_limit(self):
    import re  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
    for name, topology in (("v5e", "v5e:2x2"), ("v5p", "v5p:2x2x1"), ("v6e", "v6e:2x2")):
      devices = chips.topology_devices(topology)
      mesh = Mesh(np.asarray(devices), ("d",))
      huge = jax.ShapeDtypeStruct((len(devices) << 16, 1 << 20), np.float32,
                                  sharding=NamedSharding(mesh, PartitionSpec("d")))
      with self.assertRaises(jax.errors.JaxRuntimeError) as caught:
        jax.jit(lambda x: x * 2 + 1).lower(huge).compile()
      found = re.search(r"available HBM \(([\d.]+)G\)", str(caught.exception))
      if found is None:
        self.skipTest(f"this libtpu words its out-of-memory error otherwise: {caught.exception}")
      self.assertAlmostEqual(chips.CHIPS[name].hbm_bytes / 2**30, float(found.group(1)), places=2)


if __name__ == "__main__":
  absltest.main()
