"""One RL step of any config, measured: phase split, FLOP rate, compile time, step memory.

  .venv/bin/python bench/train_step.py                      # tiny-grpo-cpu, 2 warm-up + 8 steps
  XLA_FLAGS=--xla_force_host_platform_device_count=2 .venv/bin/python bench/train_step.py
  .venv/bin/python bench/train_step.py --shape=narrow --layers=28   # depth: compile time
  .venv/bin/python bench/train_step.py --config=configs/gspo.py:runlocal --config.train.steps=6
  .venv/bin/python bench/train_step.py --shape=qwen3_0_6b --memory_only   # compile only

The default workload is tiny-grpo-cpu, the one `bench/peers/run.sh` runs on TRL,
tunix and this project: a random 4-layer Llama (vocab 512, hidden 256, MLP 768, 4 heads,
2 kv heads of 64), float32, 8 prompts of 32 characters x G 8, 64 new tokens at temperature 1,
reward = fraction of 'a' characters, GRPO with a k3 KL of 0.04 to a frozen reference, one
update per step over all 64 rows. `--shape=narrow` shrinks the model to hidden 64, MLP 128,
4 heads of 16 (compilation then dominates the first step: the depth check).
`--shape=qwen3_0_6b` swaps in the Qwen3-0.6B shape of the
GPU runs (28 layers, hidden 1024, vocab 151,936, tied, bf16 compute / float32 parameters) with
32 prompts of 128 tokens x G 8 x 128 new tokens, micro-batch 64.

Printed: the step's median split (sample, log-probs, update), the model FLOPs of a step
(`jaxrl_llm.training.flops`) per second against a float32 2048^3 matmul measured in the same
process, the first step's time (compilation), peak RSS, and XLA's `memory_analysis()` of the
compiled policy update (its temporaries per token of a micro-batch), with what one device
holds: the train state, the reference, the sampler's KV cache, the update's arguments and
temporaries, and their sum at the update's peak. `--memory_only` compiles against shapes
alone (nothing is loaded or allocated) on this process's devices (`--run_update`: and runs it
once, to see that it fits a GPU); for a TPU slice, from any host, use `python -m
launch.compile`, which compiles every program of a step with XLA:TPU
(`--set=model.path=` swaps the recipe's checkpoint for its `model.arch` shape). The last
line is JSON.
"""
from __future__ import annotations

import ast
import json
import os
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "a config file (default: tiny-grpo-cpu)",
                                          lock_config=False)
_LAYERS = flags.DEFINE_integer("layers", 0, "override the model's depth (0: keep)")
_SHAPE = flags.DEFINE_enum("shape", "tiny", ["tiny", "narrow", "qwen3_0_6b"],
                           "the default workload's model")
_WARMUP = flags.DEFINE_integer("warmup", 2, "steps left out of the medians (the first compiles)")
_STEPS = flags.DEFINE_integer("steps", 8, "measured steps")
_MEMORY_ONLY = flags.DEFINE_bool("memory_only", False, "compile the policy update and report its "
                                 "memory; train nothing")
_RUN_UPDATE = flags.DEFINE_bool("run_update", False, "also run the compiled policy update once "
                                "(does it fit in the device's memory?)")
_MICRO_BATCH = flags.DEFINE_integer("micro_batch", 0, "override train.micro_batch_size (0: keep)")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 0, "override sampling.max_new_tokens (0: keep)")
_PROMPTS = flags.DEFINE_integer("prompts", 0, "override train.prompts_per_step (0: keep)")
_SET = flags.DEFINE_multi_string("set", [], "KEY=VALUE: set a config field of the workload, e.g. "
                                 "--set=model.remat=dots (values parsed as Python literals)")

REWARD_SRC = '''
def frac_a(prompts, completions, **fields):
  return [c.count("a") / len(c) if c else 0.0 for c in completions]
'''


def workload(tmp: str, shape: str):
  """The tiny-grpo-cpu config (or its Qwen3-0.6B-shaped variant), data and reward in `tmp`."""
  import numpy as np
  from configs import grpo
  c = grpo.get_config()
  a = c.model.arch
  if shape in ("tiny", "narrow"):
    a.vocab_size, a.hidden_size, a.intermediate_size, a.num_layers = 512, 256, 768, 4
    a.num_heads, a.num_kv_heads, a.head_dim, a.tie_word_embeddings = 4, 2, 64, False
    if shape == "narrow":
      a.hidden_size, a.intermediate_size, a.head_dim = 64, 128, 16
    P, prompt_len, G, N, micro = 8, 32, 8, 64, 64
  else:
    a.model_type, a.vocab_size, a.hidden_size, a.intermediate_size = "qwen3", 151936, 1024, 3072
    a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim = 28, 16, 8, 128
    a.tie_word_embeddings, a.rope_theta = True, 1e6
    c.model.dtype, c.model.param_dtype = "bfloat16", "float32"
    P, prompt_len, G, N, micro = 32, 128, 8, 128, 64
  a.max_position_embeddings = 4096
  rng = np.random.RandomState(0)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
  for split in ("train", "eval"):
    with open(os.path.join(tmp, f"{split}.jsonl"), "w") as f:
      for _ in range(P):
        f.write(json.dumps({"prompt": "".join(rng.choice(letters, prompt_len))}) + "\n")
  with open(os.path.join(tmp, "reward.py"), "w") as f:
    f.write(REWARD_SRC)
  c.sampling.num_samples, c.sampling.max_new_tokens, c.sampling.temperature = G, N, 1.0
  c.sampling.max_prompt_len = 2 * prompt_len
  c.sampling.prompt_buckets = (prompt_len, 2 * prompt_len)
  c.train.prompts_per_step, c.train.micro_batch_size = P, micro
  c.optimizer.lr, c.optimizer.grad_clip_norm = 1e-5, 1.0
  c.algo.kl.coef, c.algo.kl.estimator = 0.04, "k3"
  c.data.source = "jsonl:" + os.path.join(tmp, "{split}.jsonl")
  c.rewards.functions, c.rewards.weights = (os.path.join(tmp, "reward.py") + ":frac_a",), (1.0,)
  return c


def matmul_rate(dtype: str) -> float:
  """A square matmul's FLOP/s on one device (median of 10): float32 2048^3 on a CPU, as
  bench/peers/matmul_jax.py; 8192^3 in the compute dtype on an accelerator."""
  import jax
  import jax.numpy as jnp
  cpu = jax.devices()[0].platform == "cpu"
  n = 2048 if cpu else 8192
  f = jax.jit(jnp.dot)
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32 if cpu else jnp.dtype(dtype))
  for _ in range(3):
    f(a, a).block_until_ready()
  times = []
  for _ in range(10):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2 * n ** 3 / statistics.median(times)


def policy_step_memory(config, run: bool) -> dict:
  """XLA's memory analysis of the compiled policy update on a minibatch of the config's shapes,
  on this process's devices (for a TPU slice from any host: `python -m launch.compile`).

  Everything is abstract (shapes and shardings: `training.set_up(abstract=True)`; the
  minibatch and what stays resident beside the update as launch.compile builds them,
  `jaxrl_llm.aot.step`), so a model larger than this machine's memory compiles without
  loading or scoring anything; `run` places a real state and executes the update once on
  zeros. Sizes are per device: the compiled program is one device's share of the SPMD program.
  """
  import jax
  import jax.numpy as jnp
  from jaxrl_llm import sharding as sh
  from jaxrl_llm import training
  from jaxrl_llm.aot import step as aot_step
  from jaxrl_llm.training import setup as setup_lib
  plan = training.make_plan(config)
  setup = training.set_up(config, plan, abstract=not run)
  m, programs = setup.models, setup.programs
  state = setup_lib.fresh_state(setup, config.seed) if run else setup.layout
  minibatch = aot_step.minibatch(config, plan, setup)
  t = time.perf_counter()
  compiled = programs.policy_update.lower(state, minibatch, m.base).compile()
  compile_s = time.perf_counter() - t
  analysis = compiled.memory_analysis()
  micro = min(config.train.micro_batch_size, programs.minibatch_rows)
  ran = None
  if run:
    rows = sh.rows_sharding(programs.minibatch_rows, m.mesh, m.rules)
    zeros = jax.tree.map(lambda x: jax.device_put(jnp.zeros(x.shape, x.dtype), rows), minibatch)
    t = time.perf_counter()
    jax.block_until_ready(compiled(state, zeros, m.base))
    ran = time.perf_counter() - t
  resident = {k: size for k, (_, size) in aot_step.resident_buffers(config, plan, setup).items()}
  beside = sum(size for k, size in resident.items()
               if k not in ("policy", "optimizer", "value", "base"))  # the update's arguments
  tokens = minibatch.tokens.shape[1]
  # Live at the update's peak: its arguments (the donated state, the minibatch), outputs not
  # aliased to an argument, its temporaries, and beside it the frozen reference and the KV
  # buffers the samplers keep between steps.
  peak = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
          - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes + beside)
  return dict(compile_s=compile_s, run_s=ran, temp_bytes=analysis.temp_size_in_bytes,
              argument_bytes=analysis.argument_size_in_bytes,
              output_bytes=analysis.output_size_in_bytes,
              alias_bytes=analysis.alias_size_in_bytes,
              state_bytes=aot_step.bytes_per_chip(setup.layout),
              policy_opt_bytes=resident["optimizer"],
              reference_bytes=resident.get("reference", 0),
              kv_cache_bytes=resident.get("kv_cache", 0) + resident.get("eval_kv_cache", 0),
              peak_bytes=peak, temp_bytes_per_token=analysis.temp_size_in_bytes / (micro * tokens),
              micro_batch=micro, tokens_per_row=tokens, devices=m.mesh.size,
              mesh=dict(m.mesh.shape))


def main(argv):
  del argv
  import jax
  from jaxrl_llm import training
  from jaxrl_llm.training import flops, setup as setup_lib
  tmp = tempfile.mkdtemp(prefix="train_step_")
  config = _CONFIG.value if _CONFIG.value is not None else workload(tmp, _SHAPE.value)
  if _LAYERS.value:
    config.model.arch.num_layers = _LAYERS.value
  if _MICRO_BATCH.value:
    config.train.micro_batch_size = _MICRO_BATCH.value
  if _NEW_TOKENS.value:
    config.sampling.max_new_tokens = _NEW_TOKENS.value
  if _PROMPTS.value:
    config.train.prompts_per_step = _PROMPTS.value
  for item in _SET.value:
    key, value = item.split("=", 1)
    *path, last = key.split(".")
    node = config
    for part in path:
      node = node[part]
    try:
      node[last] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      node[last] = value
  config.train.steps = _WARMUP.value + _STEPS.value
  config.train.eval_every, config.train.log_every = 0, 1
  config.checkpoint.every = 0
  config.logging.trackers = ("jsonl",)
  result = dict(devices=jax.device_count(), device_kind=jax.devices()[0].device_kind,
                jax=jax.__version__, layers=config.model.arch.num_layers)
  if not _MEMORY_ONLY.value:
    result["matmul_gflops"] = matmul_rate(config.model.dtype) / 1e9
    t0 = time.perf_counter()
    training.train(config, os.path.join(tmp, "workdir"))
    result["wall_s"] = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(os.path.join(tmp, "workdir", "metrics.jsonl"))]
    rows = [r for r in rows if "step_time_s" in r]
    measured = rows[_WARMUP.value:]
    med = lambda k: statistics.median(r[k] for r in measured)
    phases = ("step", "sample", "logprob", "update")
    result.update({f"{p}_s": med(f"{p}_time_s") for p in phases})
    result.update(mfu=med("mfu"), update_mfu=med("update_mfu"))
    result.update(first_step_s=rows[0]["step_time_s"],
                  compile_s=rows[0]["step_time_s"] - med("step_time_s"),
                  step_min_s=min(r["step_time_s"] for r in measured),
                  step_max_s=max(r["step_time_s"] for r in measured),
                  peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  mean_length=statistics.mean(r["response_length_mean"] for r in measured))
    s, P = config.sampling, config.train.prompts_per_step
    plan = training.make_plan(config)
    work = flops.step_flops(
        setup_lib.model_config(config.model), plan.algo, prompts=P, samples=s.num_samples,
        prompt_len=s.prompt_buckets[0], new_tokens=s.max_new_tokens,
        generated=result["mean_length"] * P * s.num_samples, reference=plan.reference,
        value=plan.value_model, recompute_old_logp=plan.old_logp == "recompute")
    result["step_gflop"] = work["total"] / 1e9
    result["gflops"] = work["total"] / result["step_s"] / 1e9
    for p in ("sample", "logprob", "update"):
      result[f"{p}_gflops"] = work[p] / max(result[f"{p}_s"], 1e-9) / 1e9
    result["utilisation"] = result["gflops"] / result["matmul_gflops"]
  result["policy_step"] = policy_step_memory(config, _RUN_UPDATE.value)
  _print(result)


def _print(r: dict) -> None:
  print(f"\n{r['devices']} x {r['device_kind']}, jax {r['jax']}, {r['layers']} layers")
  if "step_s" in r:
    print(f"step {r['step_s']:.3f} s (min {r['step_min_s']:.3f}, max {r['step_max_s']:.3f}): "
          f"sample {r['sample_s']:.3f} s, log-probs {r['logprob_s']:.3f} s, "
          f"update {r['update_s']:.3f} s; first step {r['first_step_s']:.2f} s (compilation "
          f"{r['compile_s']:.2f} s: first step - median)")
    print(f"{r['step_gflop']:.1f} GFLOP per step -> {r['gflops']:.1f} GFLOP/s = "
          f"{100 * r['utilisation']:.1f}% of a {r['matmul_gflops']:.1f} GFLOP/s float32 2048^3 "
          f"matmul (sample {r['sample_gflops']:.0f}, log-probs {r['logprob_gflops']:.0f}, "
          f"update {r['update_gflops']:.0f} GFLOP/s); peak RSS {r['peak_rss_mib']:.0f} MiB")
    print(f"mfu {100 * r['mfu']:.1f}%, update {100 * r['update_mfu']:.1f}% (the run's own peak, "
          "see its first lines)")
  p = r["policy_step"]
  print(f"policy update, micro-batch {p['micro_batch']} x {p['tokens_per_row']} tokens: temp "
        f"{p['temp_bytes'] / 2**20:.1f} MiB = {p['temp_bytes_per_token'] / 1024:.1f} KiB/token, "
        f"arguments {p['argument_bytes'] / 2**20:.1f} MiB, compiled in {p['compile_s']:.1f} s"
        + (f", ran in {p['run_s']:.2f} s" if p["run_s"] is not None else ""))
  gib = lambda key: f"{p[key] / 2**30:.2f}"
  mesh = " x ".join(f"{k}={v}" for k, v in p["mesh"].items())
  print(f"per device ({p['devices']} devices, {mesh}), GiB:\n"
        f"  | train state | of which policy optimizer | reference | sampler KV cache | "
        f"update arguments | update temporaries | update peak with reference and cache |\n"
        f"  | {gib('state_bytes')} | {gib('policy_opt_bytes')} | {gib('reference_bytes')} | "
        f"{gib('kv_cache_bytes')} | {gib('argument_bytes')} | {gib('temp_bytes')} | "
        f"{gib('peak_bytes')} |")
  print("RESULT " + json.dumps(r))


if __name__ == "__main__":
  app.run(main)
