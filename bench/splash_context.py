"""Splash attention under the context axis, as XLA:TPU compiles it (no TPU needed).

One attention layer's gradient (queries, keys and values; Qwen3-8B's heads: 8 kv heads of
128, 4 query heads each; bf16; 4 rows of T tokens) compiled for a v5p:2x2x1 slice (4 chips)
with the rows over `data` and the sequence over `context` (data x context = 4): per chip,
XLA's temporaries and the bytes it counts. Every chip holds the same share of the work at
every context size (4 / context rows x T / context queries each), so the columns show
what splitting the sequence costs: the keys and values each chip gathers.

  .venv/bin/python bench/splash_context.py [T ...]     # default 16384 32768
"""
import json
import sys

import jax
import jax.numpy as jnp
from jax.experimental import topologies

from jaxrl_llm import sharding as sh
from jaxrl_llm.models import attention

B, K, G, D = 4, 8, 4, 128


def figures(T: int, context: int, devices) -> dict:
  mesh = sh.make_mesh(dict(data=4 // context, fsdp=1, context=context, tensor=1), devices)

  def arg(names, shape, dtype=jnp.bfloat16):
    spec = sh.logical_to_spec(names, shape, mesh, sh.DEFAULT_RULES)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(mesh, spec))

  def loss(q, k, v, valid):
    out = attention.causal_attention(q, k, v, valid, impl="splash", mesh=mesh,
                                     rules=sh.DEFAULT_RULES)
    return jnp.sum(out.astype(jnp.float32))

  kv = arg((sh.BATCH, sh.SEQ, sh.KV_HEADS, None), (B, T, K, D))
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
      arg((sh.BATCH, sh.SEQ, sh.KV_HEADS, None, None), (B, T, K, G, D)), kv, kv,
      arg((sh.BATCH, sh.SEQ), (B, T), jnp.int32)).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return dict(T=T, context=context,
              temporaries_MiB=round(compiled.memory_analysis().temp_size_in_bytes / 2**20, 1),
              bytes_GB=round(cost.get("bytes accessed", 0) / 1e9, 2))


def main(lengths):
  devices = topologies.get_topology_desc(platform="tpu", topology_name="v5p:2x2x1").devices
  print("| tokens | context | temporaries per chip (MiB) | bytes per chip (GB) |")
  print("|---|---|---|---|")
  for T in lengths:
    for context in (1, 2, 4):
      f = figures(T, context, list(devices))
      print(f"| {T} | {context} | {f['temporaries_MiB']} | {f['bytes_GB']} |", flush=True)
      print(json.dumps(f), file=sys.stderr)


if __name__ == "__main__":
  main([int(a) for a in sys.argv[1:]] or [16384, 32768])
