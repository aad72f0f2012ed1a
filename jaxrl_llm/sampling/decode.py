"""How the sampler runs the model on each platform: one table, one platform query.

The model has one way of running its layers (a scan over stacked parameters) and computes
its RoPE tables plainly. A decode step is tiny (one token per row) and runs thousands of
times, so the choices that pay on one platform only live here, in `DECODE_TUNING`, read
through `tuning(model)` (`jaxrl_llm.platform.of`):

  unroll_max_layers: run the layers as a Python loop over unstacked parameters, each layer
    with its own cache buffers, for models up to this deep (`SamplingSettings.layer_loop`
    'auto'). Inside a decode loop a CPU copies the slice of a stacked weight or cache on
    every step; unrolled, every buffer is read where it lies (README, "Memory, speed and
    compilation", has the figures), but the program and its compile time grow with depth.
    On a GPU the scan's slices are copied too: one H200, a Qwen3-0.6B shape (28 layers,
    bf16), 512 rows x 128 new tokens after 128-token prompts (bench/gpu.py, 2026-12-04):
    scanned 12.5 ms per decode step (16% of the copy bandwidth its bytes need), unrolled
    6.4 ms (28%), first call 10 s -> 34 s, peak memory 9.5 -> 11.3 GiB (the unstacked
    copy of the weights lives for the call). So a GPU unrolls every model of a published
    depth (up to 64 layers) and pays the compile once per run.
  rope_by_matmul: repeat the halves of RoPE's angles by a matmul with [I I] (exact: one
    product by 1 per output) instead of a concatenation, which XLA's CPU backend fuses
    into every consumer and so recomputes cos and sin per element of every rotated tensor
    in every layer (an optimization_barrier does not stop it).
  key_layout: how the KV cache lays out and writes keys (`kv_cache.KEY_LAYOUTS`).
    'slot_minor' on a CPU (its matmul library transposed slot-major key blocks every step)
    and a GPU (slot-major keys with the new token selected in: 9.4 ms per step unrolled,
    11.0 scanned, in the measurement above). 'slot_major' on a TPU: slot-major keys and
    token-major pages, which the layer scan reads in place (a layer's new token kept beside
    its slice; the page pool passed whole, `kv_cache.PagedIndex`) instead of XLA:TPU
    copying each layer's slice out and back every step. HBM traffic per decode step and
    chip for the Qwen3-1.7B recipe (`launch.compile`, v5e:2x4; `kv_cache` has the
    breakdown): static engine 9.9 GB -> 4.7, continuous 49.7 -> 8.4. Either layout
    samples the same tokens (tests/sampling/kv_layout_test.py).

Where the weights live while decoding (`SamplingSettings.weight_layout`) is decided here
too (`decode_weight_shardings`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import models, platform
from jaxrl_llm.models import kv_cache, load, lora, transformer
from jaxrl_llm.sampling.settings import SamplingSettings


@dataclasses.dataclass(frozen=True)
class DecodeTuning:
  """Per-platform choices of the decode loop (see the module docstring)."""
  unroll_max_layers: int
  rope_by_matmul: bool
  key_layout: str


DECODE_TUNING = {
    "cpu": DecodeTuning(unroll_max_layers=8, rope_by_matmul=True, key_layout="slot_minor"),
    "gpu": DecodeTuning(unroll_max_layers=64, rope_by_matmul=False, key_layout="slot_minor"),
    "tpu": DecodeTuning(unroll_max_layers=0, rope_by_matmul=False, key_layout="slot_major"),
}


def tuning(model: models.Model) -> DecodeTuning:
  """The row of `DECODE_TUNING` for where `model` lives."""
  return DECODE_TUNING[platform.of(model.mesh)]


def unrolls_layers(settings: SamplingSettings, model: models.Model) -> bool:
  """Whether sampling runs the layers unrolled (`SamplingSettings.layer_loop`)."""
  if settings.layer_loop != "auto":
    return settings.layer_loop == "unrolled"
  return model.config.num_layers <= tuning(model).unroll_max_layers


def decode_weight_shardings(model: models.Model, layout: str):
  """The shardings of `model`'s (stacked) parameters while decoding, or None to keep them."""
  if model.mesh is None or layout == "training":
    return None
  dropped = {"fsdp"} if layout == "tensor" else {"fsdp", "tensor"}
  keep = lambda axes: None if axes is None else tuple(
      a for a in ((axes,) if isinstance(axes, str) else axes) if a not in dropped) or None
  rules = tuple((name, keep(axes)) for name, axes in model.rules)
  return models.param_shardings(model.config, model.mesh, rules)


def rope_tables(positions_BT: jax.Array, model: models.Model, tune: DecodeTuning):
  """The model's RoPE tables (`transformer.rope_tables`), computed as `tune` says."""
  if not tune.rope_by_matmul:
    return transformer.rope_tables(positions_BT, model.config)
  freqs_BTf = transformer.rope_angles(positions_BT, model.config)
  half = freqs_BTf.shape[-1]
  repeat_fd = np.concatenate([np.eye(half, dtype=np.float32)] * 2, axis=1)  # [I I]
  both_BTd = lambda table_BTf: jnp.einsum("BTf,fd->BTd", table_BTf, repeat_fd,
                                          precision=jax.lax.Precision.HIGHEST)
  return both_BTd(jnp.cos(freqs_BTf)), both_BTd(jnp.sin(freqs_BTf))


# --- unrolled layers ------------------------------------------------------------------------------
def unstack_layers(model: models.Model) -> models.Model:
  """The model with one parameter tree per layer (a tuple under 'layers', in layer order)
  instead of stacked layers (one stack or several, `ModelConfig.stack_names`)."""
  cfg = model.config
  unstacked = tuple(jax.tree.map(lambda x, j=j: x[j], model.params[stack])
                    for stack, j, _ in load.layer_places(cfg))
  params = {k: v for k, v in model.params.items() if k not in cfg.stack_names}
  return model.replace(params=dict(params, layers=unstacked))


def per_layer(cache: dict) -> tuple[dict, ...]:
  """A stacked cache (`kv_cache`) as one dict of buffers per layer."""
  layers = next(iter(cache.values())).shape[0]
  return tuple({name: x[i] for name, x in cache.items()} for i in range(layers))


def per_layer_shardings(stacked: dict, num_layers: int) -> tuple[dict, ...]:
  """The shardings of `per_layer(cache)` from those of the stacked cache."""
  drop = lambda s: jax.sharding.NamedSharding(s.mesh, jax.sharding.PartitionSpec(*s.spec[1:]))
  return tuple({name: drop(s) for name, s in stacked.items()} for _ in range(num_layers))


def forward(model: models.Model, tokens_BT, positions_BT, kv_mask_BS, cache, cache_index, *,
            tune: DecodeTuning, return_hidden: bool = False, with_router: bool = False):
  """`models.forward` with the decode tuning: stacked parameters run the model's scan,
  unstacked ones (`unstack_layers`, with a `per_layer` cache) a loop over `Block`s.
  `with_router`: also return an MoE model's routing (`transformer.routing_summary`)."""
  rope = rope_tables(positions_BT, model, tune)
  if not isinstance(model.params.get("layers"), tuple):
    return models.forward(model, tokens_BT, positions_BT, kv_mask_BS, cache, cache_index,
                          return_hidden, rope=rope, with_router=with_router)
  apply = lambda method, x: model.module.apply({"params": model.params}, x, method=method)
  x_BTD = apply(transformer.Transformer.embed_tokens, tokens_BT)
  new_cache, routers = [], []
  for layer_params, layer_cache, kind in zip(model.params["layers"], cache,
                                             model.config.layer_kinds):
    block = transformer.Block(model.config, model.mesh, model.rules, kind=kind)
    x_BTD, (layer_cache, router) = block.apply({"params": layer_params}, x_BTD, layer_cache,
                                               rope, kv_mask_BS, cache_index)
    new_cache.append(kv_cache.commit(layer_cache, cache_index))  # a token kept beside, stored
    if router is not None:
      routers.append(jax.tree.map(lambda x: x[None], router))
  x_BTD = apply(transformer.Transformer.normalize, x_BTD)
  out = x_BTD if return_hidden else apply(transformer.Transformer.unembed, x_BTD)
  if with_router:
    return out, tuple(new_cache), transformer.routing_summary(routers) if routers else None
  return out, tuple(new_cache)


# --- routing replay's record: the experts of every token fed, -1 where none ------------------
def empty_record(cfg, *shape) -> jax.Array:
  """An MoE model's record for `shape` tokens: int32 [*shape, MoE layers, k], all -1."""
  return jnp.full(shape + (cfg.num_moe_layers, cfg.num_experts_per_tok), -1, jnp.int32)


def record_experts(record: jax.Array, experts, fed, at: tuple) -> jax.Array:
  """`record` with `experts` [..., T, MoE layers, k] written from index `at`, -1 where `fed`
  [..., T] is False."""
  experts = jnp.where(fed[..., None, None], experts, -1).astype(jnp.int32)
  return jax.lax.dynamic_update_slice(record, experts, at)


def sample_routing(prompt_experts_PSLk, completions_RNLk, G: int) -> jax.Array:
  """`SampleOutput.routing`: each prompt's experts for its G rows, then each row's
  completion tokens fed back."""
  return jnp.concatenate([jnp.repeat(prompt_experts_PSLk, G, axis=0), completions_RNLk], axis=1)


# --- the parts of a sampling program -----------------------------------------------------------
def decode_model(model: models.Model, s: SamplingSettings, unrolled: bool):
  """The model as the decode loop reads it, made once per call, not once per token: LoRA
  adapters merged into their kernels (`SamplingSettings.adapters`), the weights in the
  compute dtype, in the decode layout (`SamplingSettings.weight_layout`: no
  all-gather inside the loop), unstacked if unrolled. Returns (model, tuning)."""
  dt = model.config.jnp_dtype
  if s.adapters == "merged" and model.config.has_lora:  # LoRA: added into the kernels, once
    # In the decode layout first, so that each chip merges its own part of every kernel
    # (`lora._delta` keeps a kernel's split dims; Qwen3-8B's QLoRA sampler on v5e-8 with
    # tensor 8 held 31 GiB of temporaries when the merge ran whole on every chip, 2.5 now).
    where = decode_weight_shardings(model, s.weight_layout)
    params = model.params if where is None else jax.lax.with_sharding_constraint(
        model.params, where)
    merged = lora.merge(params, model.config, dt)
    model = model.replace(params=merged, config=lora.merged_config(model.config))
  params = jax.tree.map(lambda p: p.astype(dt) if jnp.issubdtype(p.dtype, jnp.floating) else p,
                        model.params)
  decode_shardings = decode_weight_shardings(model, s.weight_layout)
  if decode_shardings is not None:
    params = jax.lax.with_sharding_constraint(params, decode_shardings)
  model = model.replace(params=params)
  if unrolled:
    model = unstack_layers(model)
  return model, tuning(model)


def prefill(model: models.Model, tokens_PS, mask_PS, tune, unrolled: bool,
            with_router: bool = False):
  """Each prompt once: (its KV cache [P rows x S0 slots], the logits after its last token
  [P, V], its positions [P, S0][, an MoE model's experts of every prompt token
  [P, S0, MoE layers, k] with `with_router`])."""
  P, S0 = tokens_PS.shape
  positions_PS = models.positions_from_mask(mask_PS)
  prompt_cache = kv_cache.init_cache(model.config, P, S0, model.config.jnp_dtype,
                                     tune.key_layout)
  if unrolled:
    prompt_cache = per_layer(prompt_cache)
  hidden_PSD, prompt_cache, *routing = forward(
      model, tokens_PS, positions_PS, mask_PS, prompt_cache, 0, tune=tune, return_hidden=True,
      with_router=with_router)
  logits_PV = models.unembed(model, hidden_PSD[:, -1:])[:, 0]  # only the last prompt token's
  if with_router:
    return prompt_cache, logits_PV, positions_PS, routing[0]["experts"]
  return prompt_cache, logits_PV, positions_PS
