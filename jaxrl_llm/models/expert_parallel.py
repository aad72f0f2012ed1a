"""Expert parallelism: an MoE layer's experts run per device, under `jax.shard_map`.

Left to XLA's SPMD partitioner, `moe.expert_ffn` on tokens sharded over the mesh sorts all
N * k token-expert assignments of the global batch and gathers their rows: every device
then holds buffers of the whole micro-batch (for Qwen3-30B-A3B's update on 32 chips,
bf16[1441792, 2048] per chip, 61 GiB of temporaries). Here each device works on its own
tokens and its own experts only:

  1. The expert weights are constrained to their sharding without the `embed` dimension's
     mesh axes (fsdp in training; already so in the sampler's 'tensor' layout), so XLA
     gathers them like any dense layer's before the layer runs, whatever layout they
     arrive in.
  2. Inside `shard_map`, a device all-gathers its tokens, their experts and their routing
     weights over the mesh axes that split the experts (`expert`, and `tensor` where it
     splits the experts' hidden dimension F and also the tokens): the g devices that
     together hold all E experts (and all of F) then see the same g x n tokens.
  3. One source device's n tokens at a time (a scan of g steps, each rematerialised in the
     backward), the kernel (`moe.expert_ffn`) runs their assignments to this device's
     E / ep experts (ids shifted by its first expert; the others are skipped), dropless,
     in a static buffer of n * k rows: the worst case, every one of them on this device.
     So a device's buffers are those of n tokens, whatever ep is (one pass over all g x n
     tokens: 29.8 GiB of temporaries in the 30B update at 128 rows, against 21.8). A
     decode step (one token per row) is the exception: its g x n tokens are few, and one
     pass reads the local experts' weights once instead of g times.
  4. `psum_scatter` over the same axes sums each token's terms from the devices holding
     its experts (and F's partial sums) and hands every device back its own n tokens.
     Where the tokens are not split over an axis that splits the weights (a batch that
     does not divide), that axis is summed with `psum` instead.

Tokens move by all-gather rather than all-to-all (`jax.lax.ragged_all_to_all`): with
k = ep (8 and 8 for Qwen3-30B-A3B on expert 8) both move about n * k rows per device,
and a dropless all-to-all still needs a receive buffer for the worst case, g * n * k rows.

The router, softmax, top-k and the statistics stay outside (per token, plain sharded jnp).
The backward is shard_map's transpose: all_gather <-> psum_scatter, and the weights'
gradients summed over the token axes.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm import sharding as sh

# The single-device kernel (`moe.expert_ffn` with its impl chosen):
# (x_ND, experts_Nk, weights_Nk, gate_up_EDCF, down_EFD) -> y_ND.
Kernel = Callable[..., jax.Array]


def applies(mesh: Mesh | None, rules: Any) -> bool:
  """Whether the layer runs per device: a mesh of more than one device, with rules."""
  return mesh is not None and rules is not None and mesh.size > 1


def _axes(entry) -> tuple[str, ...]:
  """A PartitionSpec entry as a tuple of mesh axes."""
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def specs(x_shape, gate_up_shape, down_shape, mesh: Mesh, rules) -> dict[str, Any]:
  """The shard_map layout, from the rules: tokens [B, T, D] split as the batch rule says (D
  whole), the experts' weights split over E and F as their rules say (D whole), and the
  mesh axes the per-device results are summed over ('gather': also split the tokens, so
  they are gathered first and the sum is scattered back; 'summed': do not)."""
  tokens = sh.logical_to_spec((sh.BATCH, sh.SEQ, None), x_shape, mesh, rules)
  gate_up = sh.logical_to_spec((sh.EXPERT, None, None, sh.MLP), gate_up_shape, mesh, rules)
  down = sh.logical_to_spec((sh.EXPERT, sh.MLP, None), down_shape, mesh, rules)
  if (gate_up[0], gate_up[3]) != (down[0], down[1]):
    raise ValueError(f"config.mesh.rules: the experts' gate_up_proj splits (E, F) as "
                     f"{(gate_up[0], gate_up[3])} and down_proj as {(down[0], down[1])}; "
                     "expected the same mesh axes for both")
  token_axes = _axes(tokens[0]) + _axes(tokens[1])
  reduce_axes = _axes(gate_up[0]) + _axes(gate_up[3])
  return dict(tokens=tokens, routing=PartitionSpec(tokens[0], tokens[1], None),
              gate_up=gate_up, down=down, experts=_axes(gate_up[0]),
              gather=tuple(a for a in token_axes if a in reduce_axes),
              summed=tuple(a for a in reduce_axes if a not in token_axes))


def local_share(cfg, mesh: Mesh | None, rules) -> float:
  """The share of an MoE layer's experts one device runs (E / ep of E): what its grouped
  matmuls compute of their static buffer when the router spreads assignments evenly. The
  buffer holds the worst case, every assignment on this device, and the kernel visits only
  its own experts' rows (1 without expert parallelism)."""
  if not cfg.num_experts or not applies(mesh, rules):
    return 1.0
  E, D, F = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
  layout = specs((1, 1, D), (E, D, 2, F), (E, F, D), mesh, rules)  # the layer's own layout
  return 1.0 / math.prod(mesh.shape[a] for a in layout["experts"])


def first_expert(expert_axes: tuple[str, ...], local_experts: int):
  """The global id of this device's first expert (its index along the experts' axes)."""
  return jax.lax.axis_index(expert_axes) * local_experts if expert_axes else 0


def expert_ffn(x_BTD, experts_BTk, weights_BTk, gate_up_EDCF, down_EFD, kernel: Kernel,
               mesh: Mesh, rules, *, remat: bool = True):
  """`kernel` (`moe.expert_ffn`) of the sharded tokens, run per device (the module
  docstring): [B, T, D] in x's dtype, split like x. `remat`: each source device's chunk
  is recomputed in the backward (with the model's remat 'none', False: its residuals kept,
  g * n * k rows, for no recompute)."""
  layout = specs(x_BTD.shape, gate_up_EDCF.shape, down_EFD.shape, mesh, rules)
  gate_up_EDCF = jax.lax.with_sharding_constraint(gate_up_EDCF,
                                                  NamedSharding(mesh, layout["gate_up"]))
  down_EFD = jax.lax.with_sharding_constraint(down_EFD, NamedSharding(mesh, layout["down"]))
  body = functools.partial(_local_ffn, layout=layout, kernel=kernel, remat=remat)
  # check_vma off: a Pallas kernel (megablox's gmm) states no varying axes for its output.
  # The transpose then divides the output's cotangent over the axes its spec leaves out and
  # psums each input's over its own: exact here, where those cotangents agree across them.
  return jax.shard_map(
      body, mesh=mesh, out_specs=layout["tokens"], check_vma=False,
      in_specs=(layout["tokens"], layout["routing"], layout["routing"], layout["gate_up"],
                layout["down"]))(x_BTD, experts_BTk, weights_BTk, gate_up_EDCF, down_EFD)


def _local_ffn(x_btD, experts_btk, weights_btk, gate_up_eDCf, down_efD, *, layout, kernel,
               remat):
  """One device: its b x t tokens, its e = E / ep experts (F / tensor wide) -> [b, t, D]."""
  b, t, D = x_btD.shape
  k = experts_btk.shape[-1]
  x_nD, experts_nk, weights_nk = (x_btD.reshape(b * t, D), experts_btk.reshape(b * t, k),
                                  weights_btk.reshape(b * t, k))
  first = first_expert(layout["experts"], gate_up_eDCf.shape[0])

  def one_chunk(x_nD, experts_nk, weights_nk):
    # Ids outside [0, e) are another device's experts: the kernel skips them.
    return kernel(x_nD, experts_nk - first, weights_nk, gate_up_eDCf, down_efD)

  gather = layout["gather"]
  if not gather:
    y_nD = one_chunk(x_nD, experts_nk, weights_nk)
  elif t == 1:  # a decode step: the group's few tokens in one pass, its weights read once
    chunks = [jax.lax.all_gather(a, gather, tiled=True) for a in (x_nD, experts_nk, weights_nk)]
    y_nD = jax.lax.psum_scatter(one_chunk(*chunks), gather, scatter_dimension=0, tiled=True)
  else:  # the group's g devices' tokens [g, n, ...], the same on each of them
    chunks = [jax.lax.all_gather(a, gather) for a in (x_nD, experts_nk, weights_nk)]
    # One device's n tokens at a time, each rematerialised in the backward: buffers of n * k
    # rows, not g * n * k. Under the layer's own remat, JAX drops the recomputed layer's
    # unused forward of the chunks, so the experts' matmuls run as often as without.
    step = lambda carry, chunk: (carry, one_chunk(*chunk))
    _, y_gnD = jax.lax.scan(jax.checkpoint(step) if remat else step, None, chunks)
    # Each token's terms summed over the devices, back to the device that owns it.
    y_nD = jax.lax.psum_scatter(y_gnD, gather, scatter_dimension=0)
  if layout["summed"]:
    y_nD = jax.lax.psum(y_nD, layout["summed"])
  return y_nD.reshape(b, t, D)
