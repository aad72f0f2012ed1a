"""The machine's ceiling for the table's ratios: a float32 matmul's FLOP rate through jax.

A GRPO step of tiny-grpo-cpu is mostly matmuls, so how fast this machine multiplies
float32 matrices bounds how fast any stack can run it. This times a jitted
`jnp.dot` of two square float32 matrices (1024^3 and 2048^3; 2 n^3 FLOPs each), after 3
warm-up calls, 10 times, waiting for each result, and reports the median rate (and the
best). The table divides a step's analytic 207 GFLOP by its median time and by the
2048^3 median rate of the same round: the share of the machine a stack's step uses.

Run it with the checkout's environment (the jax that jaxrl_llm runs on), with the
default XLA flags: one CPU device, whose matmuls use every core.

  .venv/bin/python bench/peers/matmul_jax.py --round 1
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workload as W  # noqa: E402

SIZES = (1024, 2048)
WARMUP_CALLS, TIMED_CALLS = 3, 10


def rate(n: int) -> dict:
  """Times `TIMED_CALLS` float32 n x n x n matmuls; GFLOP/s of the median and best call."""
  import jax
  import jax.numpy as jnp
  ka, kb = jax.random.split(jax.random.key(n))
  a = jax.random.normal(ka, (n, n), jnp.float32)
  b = jax.random.normal(kb, (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  for _ in range(WARMUP_CALLS):
    dot(a, b).block_until_ready()
  times = []
  for _ in range(TIMED_CALLS):
    t = time.perf_counter()
    dot(a, b).block_until_ready()
    times.append(time.perf_counter() - t)
  flop = 2 * n ** 3
  return dict(seconds=W.summary(times), gflops_median=flop / statistics.median(times) / 1e9,
              gflops_best=flop / min(times) / 1e9)


def main():
  args = W.runner_args("matmul_jax", __doc__)
  recorder = W.Recorder(args.bench, args.round, args.results)
  import jax
  result = dict(stack="jax matmul", versions=dict(jax=jax.__version__),
                devices=jax.device_count(), xla_flags=os.environ.get("XLA_FLAGS", ""))
  for n in SIZES:
    result[f"matmul_{n}"] = rate(n)
    print(f"float32 {n}^3: {result[f'matmul_{n}']['gflops_median']:.1f} GFLOP/s (median), "
          f"{result[f'matmul_{n}']['gflops_best']:.1f} (best)")
  result["gflops"] = result["matmul_2048"]["gflops_median"]
  recorder.save(result)


if __name__ == "__main__":
  main()
