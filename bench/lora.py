"""LoRA and QLoRA, measured: the update's memory, the int8 base's bytes, and how adapters decode.

  .venv/bin/python bench/lora.py                  # all three parts
  .venv/bin/python bench/lora.py --part=memory    # or: bytes, decode

memory: XLA's `memory_analysis()` of the compiled policy update (compiled against shapes
only, as `bench/train_step.py --memory_only`) of the Qwen3-0.6B shape (28 layers, hidden
1024, vocab 151,936, tied; bf16 compute, float32 parameters; 32 prompts x G 8, rows of
256 prompt + 128 new tokens, micro-batch 8), full fine-tuning against LoRA rank 16 on every
projection, with a float32 and an int8 base. "Frozen" is what the update reads but never changes: the
reference for full fine-tuning, the base for LoRA (which is its reference too).

bytes: the layers' projection kernels of the same shape in bf16 against int8 plus scales.

decode: the static sampler on bench/sampler.py's workload (a 4-layer Llama, hidden 256,
64 rows, 64 new tokens, float32) with rank-16 adapters on every projection, merged once
per call against applied at every step (`SamplingSettings.adapters`), for a float32 and
an int8 base, and the same model without adapters; median of 5 calls after a warm-up.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

_PART = flags.DEFINE_enum("part", "all", ["all", "memory", "bytes", "decode"], "what to measure")


def memory():
  import train_step  # bench/train_step.py
  rows = []
  for name, sets in (("full fine-tuning", {}), ("LoRA r=16", {"lora.rank": 16}),
                     ("QLoRA r=16, int8 base", {"lora.rank": 16, "lora.base_quant": "int8"})):
    config = train_step.workload(tempfile.mkdtemp(), "qwen3_0_6b")
    config.train.micro_batch_size = 8
    for key, value in sets.items():
      group, field = key.split(".")
      config[group][field] = value
    p = train_step.policy_step_memory(config, run=False)
    # LoRA's base is an argument of the update (the rest of the arguments beside the state
    # is the minibatch, a few MiB); full fine-tuning's reference is not.
    frozen = p["reference_bytes"] + p["argument_bytes"] - p["state_bytes"]
    rows.append((name, p["state_bytes"], p["temp_bytes"], frozen))
  gib = lambda b: f"{b / 2**30:.2f}"
  print("\n| 0.6B-shape policy update, GiB | train state | temporaries | state + temporaries "
        "| frozen (reference / base) | all three |")
  print("|---|---|---|---|---|---|")
  full = rows[0][1] + rows[0][2]
  full_all = full + rows[0][3]
  for name, state, temp, frozen in rows:
    print(f"| {name} | {gib(state)} | {gib(temp)} | {gib(state + temp)} "
          f"({full / (state + temp):.1f}x lower) | {gib(frozen)} | {gib(state + temp + frozen)} "
          f"({full_all / (state + temp + frozen):.1f}x lower) |")


def base_bytes():
  import jax
  from jaxrl_llm import models
  from jaxrl_llm.models import quant
  import train_step
  config = train_step.workload(tempfile.mkdtemp(), "qwen3_0_6b")
  from jaxrl_llm.training import setup as setup_lib
  cfg = setup_lib.model_config(config.model).replace(param_dtype="bfloat16")
  shapes = lambda c: jax.eval_shape(lambda: models.init(c, jax.random.key(0)).params)
  b16 = quant.quantized_bytes(shapes(cfg))
  b8 = quant.quantized_bytes(shapes(cfg.replace(base_quant="int8")))
  print(f"\n0.6B-shape layers' projection kernels: bf16 {b16['projections'] / 2**20:.0f} MiB, "
        f"int8 + scales {b8['projections'] / 2**20:.0f} MiB "
        f"({b8['projections'] / b16['projections']:.3f} of bf16); the rest (embedding, norms) "
        f"{b16['other'] / 2**20:.0f} MiB in bf16 either way")


def decode():
  import jax
  import numpy as np
  from jaxrl_llm import models, sampling
  from jaxrl_llm.models import lora
  from jaxrl_llm.models.config import LORA_TARGETS
  cfg = models.ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=768, num_layers=4,
                           num_heads=4, num_kv_heads=2, head_dim=64)
  base = models.init(cfg, jax.random.key(0))
  prompts = [list(np.random.default_rng(i).integers(3, 500, 32)) for i in range(8)]

  def timed(model, mode):
    sampler = sampling.Sampler(sampling.SamplingSettings(num_samples=8, max_new_tokens=64,
                                                         temperature=1.0, adapters=mode))
    run = lambda seed: jax.block_until_ready(sampler(model, prompts, seed).tokens)
    run(0)
    times = []
    for seed in range(1, 6):
      t = time.perf_counter()
      run(seed)
      times.append(time.perf_counter() - t)
    return statistics.median(times)

  def adapted(model):
    m = models.with_lora(model, 16, 32, LORA_TARGETS, jax.random.key(1))
    b, a = lora.split(m.params)
    a = jax.tree.map(lambda x: x + 0.01, a)
    return m.replace(params=lora.join(b, a))

  plain = timed(base, "merged")
  print(f"\n| decode, 64 rows x 64 new tokens, CPU | s per call | vs no adapters |\n|---|---|---|")
  print(f"| float32 model, no adapters | {plain:.3f} | 1.00 |")
  for name, model in (("float32 base", adapted(base)),
                      ("int8 base", adapted(models.quantize_base(base)))):
    for mode in ("merged", "applied"):
      t = timed(model, mode)
      print(f"| {name}, adapters {mode} | {t:.3f} | {t / plain:.2f} |")


def main(argv):
  del argv
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  part = _PART.value
  if part in ("all", "bytes"):
    base_bytes()
  if part in ("all", "memory"):
    memory()
  if part in ("all", "decode"):
    decode()


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  app.run(main)
