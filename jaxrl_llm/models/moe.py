"""The mixture-of-experts MLP (Qwen3-MoE, Mixtral): a float32 router picks k of E experts
per token, and the experts run dropless, grouped by expert.

Router: logits = x W_r in float32, p = softmax(logits). A token's experts are the top k of
p, and its weights are their p (renormalised to sum to 1 with `norm_topk_prob`). The output
is y = sum_j w_j * expert_{e_j}(x), each expert a SwiGLU like the dense `Mlp`.

Routing replay (R3, arXiv 2510.11370). Recorded experts [..., k] (-1 where none was
recorded) replace the live top-k, weighted by the live router's p at them (renormalised
likewise). So the forward routes as the sampler did, and the router still gets a gradient.

Experts, dropless (`expert_ffn`, every assignment computed):
  gmm:     the N * k assignments sorted by expert, then the Pallas TPU grouped matmul
           (`jax.experimental.pallas.ops.tpu.megablox.gmm`, its backward `tgmm`), which
           visits only the row tiles of each group. 'auto' on a TPU.
  ragged:  the same sorted assignments, then `jax.lax.ragged_dot`. On a TPU its forward and
           input gradient are native kernels, but its weight gradient lowers to a dense
           masked matmul per group, E times the work (compiled for v5p, `expert_ffn`'s
           forward and backward over 45,056 rows and 16 experts of 2048 x 768: 7.7e12
           flops against gmm's 1.3e12). 'auto' on a GPU.
  blocked: the same sorted assignments, with each expert's run padded to whole blocks of b
           rows, then one batched matmul of the blocks against their experts' weights. XLA's
           CPU lowering of ragged_dot computes every group against every row (E times the
           work), so 'auto' takes this one on a CPU.
On a mesh of several devices the experts run per device (`expert_parallel`), each device
calling `expert_ffn` on its share.

Router statistics (`RouterStats`, summed over a layer's real tokens) let the model compute
the load-balancing loss as transformers does (`aux_loss`) and the router z-loss.
"""
from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import megablox
from jax.sharding import Mesh

from jaxrl_llm import platform
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import expert_parallel
from jaxrl_llm.models.config import ModelConfig

_init = nn.initializers.normal(stddev=0.02)
MAX_BLOCK = 128
IMPLS = ("ragged", "blocked", "gmm")
# megablox's largest (rows, contracted and output) tiles.
GMM_TILE = (512, 1024)
# What 'auto' runs per platform: see the module docstring.
AUTO_IMPL = {"cpu": "blocked", "gpu": "ragged", "tpu": "gmm"}


def resolve(impl: str, mesh: Mesh | None) -> str:
  """The implementation 'auto' stands for where `mesh` lives."""
  return AUTO_IMPL[platform.of(mesh)] if impl == "auto" else impl


def route(logits_NE: jax.Array, k: int, norm_topk_prob: bool, replay_Nk: jax.Array | None = None):
  """(experts [N, k] int32, weights [N, k] float32, live top-k [N, k], probs [N, E])."""
  probs_NE = jax.nn.softmax(logits_NE.astype(jnp.float32), axis=-1)
  _, live_Nk = jax.lax.top_k(probs_NE, k)
  live_Nk = live_Nk.astype(jnp.int32)
  experts_Nk = live_Nk if replay_Nk is None else jnp.where(replay_Nk >= 0, replay_Nk, live_Nk)
  weights_Nk = jnp.take_along_axis(probs_NE, experts_Nk, axis=-1)
  if norm_topk_prob:
    weights_Nk = weights_Nk / jnp.sum(weights_Nk, axis=-1, keepdims=True)
  return experts_Nk, weights_Nk, live_Nk, probs_NE


def _block_size(assignments: int, num_experts: int) -> int:
  """Rows per block: about one expert's average share, a power of two in [8, MAX_BLOCK]."""
  mean = max(assignments // num_experts, 1)
  return int(min(max(8, 1 << (mean.bit_length() - 1)), MAX_BLOCK))


def expert_ffn(x_ND, experts_Nk, weights_Nk, gate_up_EDCF, down_EFD, impl: str, *,
               interpret: bool = False):
  """sum_j w_j * down_e(silu(gate_e(x)) * up_e(x)) over each token's k experts: [N, D].

  An expert id outside [0, E) is skipped (its term is 0): under expert parallelism the
  caller passes its tokens' experts relative to the E experts it holds, and the others are
  another device's (`expert_parallel`). `interpret`: run 'gmm' in Pallas's interpreter
  (off TPU; tests).
  """
  N, D = x_ND.shape
  k = experts_Nk.shape[1]
  E, _, _, F = gate_up_EDCF.shape
  A = N * k
  flat_A = experts_Nk.reshape(A)
  mine_A = (flat_A >= 0) & (flat_A < E)
  key_A = jnp.where(mine_A, flat_A, E)  # skipped assignments sort last, past every group
  order_A = jnp.argsort(key_A, stable=True)  # assignments grouped by expert
  token_A = order_A // k
  sizes_E = jnp.bincount(key_A, length=E).astype(jnp.int32)  # drops the skipped (key E)
  x_AD = jnp.take(x_ND, token_A, axis=0)
  gate_up_EDf = gate_up_EDCF.reshape(E, D, 2 * F)

  def swiglu(h_Af):
    return jax.nn.silu(h_Af[..., :F]) * h_Af[..., F:]

  if impl in ("ragged", "gmm"):
    matmul = functools.partial(grouped_matmul, sizes_E=sizes_E, impl=impl, interpret=interpret)
    y_AD = matmul(swiglu(matmul(x_AD, gate_up_EDf)), down_EFD)
  elif impl == "blocked":
    y_AD = _blocked_ffn(x_AD, jnp.take(key_A, order_A), sizes_E, gate_up_EDf, down_EFD, swiglu)
  else:
    raise ValueError(f"moe_impl={impl!r}: expected one of {list(IMPLS)}")
  # Back to token order (assignment a is token a // k's slot a % k) by a gather through the
  # inverse permutation, not a scatter: a scatter's derivative tracks which update wins
  # with a u32 copy of the rows (2.75 GiB per layer for Qwen3-30B-A3B's update).
  inverse_A = jnp.zeros((A,), jnp.int32).at[order_A].set(jnp.arange(A, dtype=jnp.int32),
                                                         unique_indices=True)
  y_NkD = jnp.take(y_AD, inverse_A, axis=0, unique_indices=True).reshape(N, k, D)
  return jnp.einsum("NkD,Nk->ND", y_NkD, weights_Nk.astype(y_NkD.dtype))


def grouped_matmul(lhs_AK, rhs_EKM, sizes_E, impl: str, interpret: bool = False):
  """Rows [start_e, start_e + sizes_E[e]) of lhs times rhs[e] ([A, M]); rows past the last
  group come out 0. 'ragged': `jax.lax.ragged_dot`; 'gmm': the Pallas TPU kernel, its rows
  padded to whole tiles, and the rows past the groups given to one more group that holds
  no weights, so that neither its forward nor its backward computes or leaves garbage in
  them (the kernel's `group_offset` masking)."""
  if impl == "ragged":
    return jax.lax.ragged_dot(lhs_AK, rhs_EKM, sizes_E)
  A, K = lhs_AK.shape
  M = rhs_EKM.shape[2]
  tm = 128 if A <= 1024 else GMM_TILE[0]
  rows = -(-A // tm) * tm
  lhs_RK = jnp.pad(lhs_AK, ((0, rows - A), (0, 0)))
  sizes_G = jnp.concatenate([sizes_E, (rows - jnp.sum(sizes_E))[None]]).astype(jnp.int32)
  # The backward swaps the roles of K and M, and Mosaic takes a block dim that is a multiple
  # of 128 or the whole dim: one multiple of 128 for both (a partial last tile is masked).
  tile = min(-(-min(K, M) // 128) * 128, GMM_TILE[1])
  tiling = (tm, tile, tile)
  out_RM = megablox.gmm(lhs_RK, rhs_EKM, sizes_G, lhs_AK.dtype, tiling,
                        jnp.zeros((), jnp.int32), None, False, interpret)
  return out_RM[:A]


def _blocked_ffn(x_AD, sorted_key_A, sizes_E, gate_up_EDf, down_EFD, swiglu):
  """The SwiGLU experts over the sorted assignments, each expert's run padded to whole
  blocks of b rows and one batched matmul of the blocks against their experts' weights
  (rows of skipped assignments, key E, come out 0)."""
  A, D = x_AD.shape
  E = sizes_E.shape[0]
  b = _block_size(A, E)
  rows = -(-(A + E * (b - 1)) // b) * b  # enough blocks for every expert's padded run
  padded_E = -(-sizes_E // b) * b
  start_E = jnp.cumsum(sizes_E) - sizes_E
  pstart_E = jnp.cumsum(padded_E) - padded_E
  e_A = jnp.minimum(sorted_key_A, E - 1)
  dest_A = jnp.take(pstart_E, e_A) + jnp.arange(A) - jnp.take(start_E, e_A)
  dest_A = jnp.where(sorted_key_A < E, dest_A, rows)  # skipped: no row
  source_R = jnp.full((rows,), A, jnp.int32).at[dest_A].set(jnp.arange(A, dtype=jnp.int32),
                                                            mode="drop")
  x_RD = jnp.take(jnp.concatenate([x_AD, jnp.zeros((1, D), x_AD.dtype)]), source_R, axis=0)
  block_e = jnp.searchsorted(jnp.cumsum(padded_E), jnp.arange(rows // b) * b, side="right")
  block_e = jnp.minimum(block_e, E - 1)  # blocks past the last run hold only zeros
  x_nbD = x_RD.reshape(rows // b, b, D)
  h_nbF = swiglu(jnp.einsum("nbD,nDf->nbf", x_nbD, jnp.take(gate_up_EDf, block_e, axis=0)))
  y_nbD = jnp.einsum("nbF,nFD->nbD", h_nbF, jnp.take(down_EFD, block_e, axis=0))
  return jnp.take(y_nbD.reshape(rows, D), dest_A, axis=0, mode="fill", fill_value=0)


def router_stats(logits_NE, probs_NE, live_Nk, weights_N) -> dict[str, jax.Array]:
  """One layer's sums over its tokens (weighted by `weights_N`, 0 for padding): top-k
  assignments per expert [E], router probabilities per expert [E], tokens [], and
  logsumexp(logits)^2 (the z-loss's numerator) []."""
  E = probs_NE.shape[-1]
  w_N = weights_N.astype(jnp.float32)
  counts_E = jnp.zeros((E,), jnp.float32).at[live_Nk.reshape(-1)].add(
      jnp.repeat(w_N, live_Nk.shape[1]))
  lse_N = jax.nn.logsumexp(logits_NE.astype(jnp.float32), axis=-1)
  return {"counts": counts_E, "probs": jnp.einsum("NE,N->E", probs_NE, w_N),
          "tokens": jnp.sum(w_N), "z": jnp.sum(w_N * lse_N * lse_N)}


def aux_loss(stats: dict[str, jax.Array], num_experts: int) -> jax.Array:
  """transformers' `load_balancing_loss_func`: sums over all MoE layers [Lm, ...] first,
  then E * sum_e (assignments_e / tokens) * (probability_e / tokens)."""
  tokens = jnp.maximum(jnp.sum(stats["tokens"]), 1e-9)
  return num_experts * jnp.sum(jnp.sum(stats["counts"], 0) / tokens * jnp.sum(stats["probs"], 0)
                               / tokens)


def z_loss(stats: dict[str, jax.Array]) -> jax.Array:
  """The router z-loss (ST-MoE): mean over tokens and MoE layers of logsumexp(logits)^2."""
  return jnp.sum(stats["z"]) / jnp.maximum(jnp.sum(stats["tokens"]), 1e-9)


def expert_load_max(stats: dict[str, jax.Array]) -> jax.Array:
  """The largest share of a layer's top-k assignments that one expert takes (1/E when
  balanced), the maximum over MoE layers."""
  share_LE = stats["counts"] / jnp.maximum(jnp.sum(stats["counts"], -1, keepdims=True), 1e-9)
  return jnp.max(share_LE)


class MoeMlp(nn.Module):
  """Router + E SwiGLU experts (see the module docstring).

  (x_BTD, token weights [B, T] for the statistics, replay [B, T, k] or None) ->
  (y_BTD, {'experts': the experts used [B, T, k] int32, **router_stats}). The statistics
  (and so the load-balancing loss) follow the live router's top-k, as transformers does,
  also when the experts used are replayed. With a mesh of several devices the experts run
  per device (`expert_parallel`); without one (or inside a caller's own shard_map, as the
  continuous engine runs it) on whatever this device holds.
  """
  cfg: ModelConfig
  mesh: Mesh | None = None
  rules: Any = None

  @nn.compact
  def __call__(self, x_BTD, token_weights_BT, replay_BTk=None):
    cfg = self.cfg
    D, E, F, k = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    dt, pdt = cfg.jnp_dtype, cfg.jnp_param_dtype
    B, T = x_BTD.shape[:2]
    param = lambda name, shape, axes: self.param(
        name, nn.with_logical_partitioning(_init, axes), shape, pdt)
    router_DE = param("router", (D, E), (sh.EMBED, None))
    gate_up_EDCF = param("gate_up_proj", (E, D, 2, F), (sh.EXPERT, sh.EMBED, None, sh.MLP))
    down_EFD = param("down_proj", (E, F, D), (sh.EXPERT, sh.MLP, sh.EMBED))
    x_ND = x_BTD.reshape(B * T, D)
    logits_NE = jnp.einsum("ND,DE->NE", x_ND.astype(jnp.float32), router_DE.astype(jnp.float32))
    replay_Nk = None if replay_BTk is None else replay_BTk.reshape(B * T, k)
    experts_Nk, weights_Nk, live_Nk, probs_NE = route(logits_NE, k, cfg.norm_topk_prob, replay_Nk)
    kernel = functools.partial(expert_ffn, impl=resolve(cfg.moe_impl, self.mesh),
                               interpret=platform.of(self.mesh) != "tpu")
    if expert_parallel.applies(self.mesh, self.rules):  # per device (`expert_parallel`)
      y_BTD = expert_parallel.expert_ffn(
          x_BTD.astype(dt), experts_Nk.reshape(B, T, k), weights_Nk.reshape(B, T, k),
          gate_up_EDCF.astype(dt), down_EFD.astype(dt), kernel, self.mesh, self.rules,
          remat=cfg.remat != "none")
    else:
      y_BTD = kernel(x_ND.astype(dt), experts_Nk, weights_Nk, gate_up_EDCF.astype(dt),
                     down_EFD.astype(dt)).reshape(B, T, D)
    stats = router_stats(logits_NE, probs_NE, live_Nk, token_weights_BT.reshape(B * T))
    return y_BTD.astype(dt), dict(stats, experts=experts_Nk.reshape(B, T, k))
