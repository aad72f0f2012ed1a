"""ModelConfig: the architecture of one decoder, read from and written to HF `config.json`.

One config covers the Llama 3 family, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm) and the
mixture-of-experts Qwen3-MoE and Mixtral (`num_experts` > 0; the MoE layers are
`moe_layers`, the others dense). The fields are hashable so a config can be a static
argument of `jax.jit`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral")
MOE_MODEL_TYPES = ("qwen3_moe", "mixtral")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
HEADS = ("lm", "value")
# What the backward pass keeps of each layer (`jax.checkpoint` policies; see `Transformer`):
#   none:  everything the forward made (fastest, most memory);
#   dots:  the outputs of the weight matmuls (projections, MLP), recomputing the cheap
#          elementwise work and the attention scores;
#   full:  only each layer's input, recomputing the whole layer (least memory).
REMAT_POLICIES = ("none", "dots", "full")
# Training attention (`attention.causal_attention`): 'auto' picks per platform and shape.
ATTENTION_IMPLS = ("auto", "xla", "blockwise", "cudnn", "splash")
# How an MoE layer runs its experts (`moe.expert_ffn`): 'auto' picks per platform.
MOE_IMPLS = ("auto", "ragged", "blocked", "gmm")
# The projections a LoRA adapter can sit on (`lora`): attention's fused q/k/v and its
# output, the MLP's fused gate/up and its down projection.
LORA_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def lora_targets(spec: str) -> tuple[str, ...]:
  """`config.lora.targets` ('all', or comma-separated names from LORA_TARGETS) as the
  projection names that carry adapters; unknown names are kept for the caller to refuse."""
  if spec.strip() == "all":
    return LORA_TARGETS
  return tuple(t.strip() for t in spec.split(",") if t.strip())
# How the frozen weights of the layers' projections are stored (`quant`): as they are, or
# int8 with one float scale per output channel (QLoRA's frozen base).
BASE_QUANTS = ("none", "int8")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture and numerics of a decoder-only transformer.

  Attributes:
    model_type: one of SUPPORTED_MODEL_TYPES (only changes the defaults of the flags below
      and the `model_type` written back to config.json).
    vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
    head_dim: the shapes (V, D, F, L, H, K, Dh).
    rope_theta: RoPE base.
    rope_scaling: None or a tuple of (key, value) pairs of HF's rope parameters
      ('rope_type' in SUPPORTED_ROPE_TYPES), kept as a tuple so the config hashes.
    rms_norm_eps: RMSNorm epsilon.
    tie_word_embeddings: the unembedding is the transposed embedding.
    qkv_bias: q/k/v projections have a bias (Qwen2; Llama/Qwen3 with attention_bias).
    o_bias: the output projection has a bias (Llama/Qwen3 with attention_bias).
    mlp_bias: gate/up/down projections have a bias (Llama's mlp_bias).
    qk_norm: RMSNorm over head_dim on queries and keys before RoPE (Qwen3).
    max_position_embeddings: written back to config.json; not a hard limit here.
    dtype: compute dtype name; param_dtype: parameter storage dtype name.
    remat: what the backward pass saves of each layer, one of REMAT_POLICIES.
    attention: the training attention kernel, one of ATTENTION_IMPLS.
    head: 'lm' (next-token logits) or 'value' (one scalar per position, for PPO's critic).
    bos_token_id, eos_token_id, pad_token_id: carried over from config.json (eos may be a tuple).
    num_experts: E, experts per MoE layer (0: a dense model).
    num_experts_per_tok: k, experts each token is routed to.
    moe_intermediate_size: F of each expert (the dense layers keep `intermediate_size`).
    norm_topk_prob: the k routing weights are renormalised to sum to 1 (Mixtral always;
      Qwen3-MoE's `norm_topk_prob`).
    moe_layers: the indices of the MoE layers (None: every layer, when num_experts > 0);
      from Qwen3-MoE's `decoder_sparse_step` and `mlp_only_layers`.
    router_aux_loss_coef: the weight of the load-balancing loss in an update (config.json's,
      written back; the trainer's `config.model.router_aux_loss_coef` may replace it).
    router_z_loss_coef: the weight of the router z-loss in an update (0: off).
    moe_impl: how the experts run, one of MOE_IMPLS (`moe.expert_ffn`).
    lora_rank: r of the LoRA adapters (0: none; `lora`).
    lora_alpha: their scale is lora_alpha / lora_rank (PEFT's).
    lora_targets: the projections that carry one (names in LORA_TARGETS).
    lora_dropout: dropout on an adapter's input, in forwards given a 'dropout' key.
    base_quant: how the layers' projection kernels are stored, one of BASE_QUANTS
      (`quant`); 'int8' only beside adapters (the frozen base of QLoRA).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  model_type: str = "llama"
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 4096
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  attention: str = "auto"
  head: str = "lm"
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = True
  moe_layers: tuple[int, ...] | None = None
  router_aux_loss_coef: float = 0.0
  router_z_loss_coef: float = 0.0
  moe_impl: str = "auto"
  lora_rank: int = 0
  lora_alpha: float = 0.0
  lora_targets: tuple[str, ...] = ()
  lora_dropout: float = 0.0
  base_quant: str = "none"

  def __post_init__(self):
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"model_type={self.model_type!r} is not supported; "
                       f"expected one of {list(SUPPORTED_MODEL_TYPES)}")
    for name in ("dtype", "param_dtype"):
      check_dtype(name, getattr(self, name))
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat={self.remat!r}: expected one of {list(REMAT_POLICIES)}")
    if self.attention not in ATTENTION_IMPLS:
      raise ValueError(f"attention={self.attention!r}: expected one of {list(ATTENTION_IMPLS)}")
    if self.head not in HEADS:
      raise ValueError(f"head={self.head!r}: expected one of {list(HEADS)}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                 "num_heads", "num_kv_heads", "head_dim"):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"{name}={getattr(self, name)!r}: expected a positive integer")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads} (grouped-query attention)")
    if self.moe_impl not in MOE_IMPLS:
      raise ValueError(f"moe_impl={self.moe_impl!r}: expected one of {list(MOE_IMPLS)}")
    if (self.num_experts > 0) != (self.model_type in MOE_MODEL_TYPES):
      raise ValueError(f"model_type={self.model_type!r} with num_experts={self.num_experts}: "
                       f"expected num_experts > 0 exactly for {list(MOE_MODEL_TYPES)}")
    if self.num_experts > 0:
      if not 0 < self.num_experts_per_tok <= self.num_experts:
        raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok}: expected 1 to "
                         f"num_experts={self.num_experts}")
      if self.moe_intermediate_size <= 0:
        raise ValueError(f"moe_intermediate_size={self.moe_intermediate_size}: expected a "
                         "positive integer")
      bad = [i for i in self.moe_layers or () if not 0 <= i < self.num_layers]
      if bad or list(self.moe_layers or ()) != sorted(set(self.moe_layers or ())):
        raise ValueError(f"moe_layers={self.moe_layers}: expected increasing layer indices in "
                         f"[0, {self.num_layers})")
    self._check_lora()
    rope_type = self.rope_params.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
      raise ValueError(f"rope_scaling rope_type={rope_type!r} is not supported; "
                       f"expected one of {list(SUPPORTED_ROPE_TYPES)}")

  def _check_lora(self):
    if self.lora_rank < 0:
      raise ValueError(f"lora_rank={self.lora_rank}: expected 0 (no adapters) or more")
    bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
    if bad or (self.lora_rank > 0) != bool(self.lora_targets):
      raise ValueError(f"lora_targets={self.lora_targets}: expected names from "
                       f"{list(LORA_TARGETS)}, some exactly when lora_rank > 0")
    if self.lora_rank > 0 and self.is_moe and {"gate_up_proj", "down_proj"} & set(self.lora_targets):
      raise ValueError(f"lora_targets={self.lora_targets}: an MoE model's experts carry no "
                       "adapters; expected attention targets only (qkv_proj, o_proj)")
    if not 0 <= self.lora_dropout < 1:
      raise ValueError(f"lora_dropout={self.lora_dropout}: expected a probability in [0, 1)")
    if self.base_quant not in BASE_QUANTS:
      raise ValueError(f"base_quant={self.base_quant!r}: expected one of {list(BASE_QUANTS)}")

  @property
  def has_lora(self) -> bool:
    return self.lora_rank > 0

  @property
  def lora_scale(self) -> float:
    return self.lora_alpha / self.lora_rank

  def without_lora(self) -> "ModelConfig":
    """The same model without adapters: the base (still stored as `base_quant` says)."""
    return self.replace(lora_rank=0, lora_alpha=0.0, lora_targets=(), lora_dropout=0.0)

  @property
  def rope_params(self) -> dict[str, Any]:
    return dict(self.rope_scaling or ())

  @property
  def jnp_dtype(self):
    return DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return DTYPES[self.param_dtype]

  @property
  def is_moe(self) -> bool:
    return self.num_experts > 0

  @property
  def layer_kinds(self) -> tuple[str, ...]:
    """'moe' or 'dense' for each layer."""
    if not self.is_moe:
      return ("dense",) * self.num_layers
    moe = set(range(self.num_layers) if self.moe_layers is None else self.moe_layers)
    return tuple("moe" if i in moe else "dense" for i in range(self.num_layers))

  @property
  def num_moe_layers(self) -> int:
    return self.layer_kinds.count("moe")

  @property
  def segments(self) -> tuple[tuple[str, int, int], ...]:
    """Runs of consecutive layers of one kind, (kind, start, stop): each is one scan
    (`transformer.Transformer`)."""
    runs, kinds = [], self.layer_kinds
    for i, kind in enumerate(kinds):
      if runs and runs[-1][0] == kind:
        runs[-1][2] = i + 1
      else:
        runs.append([kind, i, i + 1])
    return tuple(tuple(r) for r in runs)

  @property
  def stack_names(self) -> tuple[str, ...]:
    """The parameter names of the layer stacks, one per segment: 'layers' when every layer
    is of one kind, else 'layers_0', 'layers_1', ..."""
    n = len(self.segments)
    return ("layers",) if n == 1 else tuple(f"layers_{i}" for i in range(n))

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)


def check_dtype(field: str, value: str) -> str:
  if value not in DTYPES:
    raise ValueError(f"{field}={value!r} is not a known dtype; expected one of {list(DTYPES)}")
  return value


def _hashable(value):
  if isinstance(value, dict):
    return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
  if isinstance(value, list):
    return tuple(_hashable(v) for v in value)
  return value


def from_hf_dict(hf: dict[str, Any], *, dtype: str = "float32", param_dtype: str | None = None,
                 remat: str = "none", attention: str = "auto") -> ModelConfig:
  """Reads a Hugging Face `config.json` dict (transformers 4.x or 5.x layout)."""
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"config.json model_type={model_type!r} is not supported; "
                     f"expected one of {list(SUPPORTED_MODEL_TYPES)}")
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"config.json hidden_act={act!r} is not supported; expected 'silu'")
  if hf.get("use_sliding_window"):
    raise ValueError("config.json use_sliding_window=True is not supported; expected False")
  # transformers 5 keeps theta and scaling in `rope_parameters`; 4.x in rope_theta/rope_scaling.
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  rope_theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
  if "type" in rope and "rope_type" not in rope:
    rope["rope_type"] = rope.pop("type")
  if rope.get("rope_type", "default") == "default":
    rope = {}
  num_heads = hf["num_attention_heads"]
  head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
  attention_bias = bool(hf.get("attention_bias", False))
  eos = hf.get("eos_token_id")
  moe = _moe_fields(hf, model_type)
  return ModelConfig(
      model_type=model_type,
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      intermediate_size=hf.get("intermediate_size") or moe.get("moe_intermediate_size"),
      num_layers=hf["num_hidden_layers"],
      num_heads=num_heads,
      num_kv_heads=hf.get("num_key_value_heads") or num_heads,
      head_dim=head_dim,
      rope_theta=rope_theta,
      rope_scaling=_hashable(rope) or None,
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=True if model_type == "qwen2" else attention_bias,
      o_bias=False if model_type == "qwen2" else attention_bias,
      mlp_bias=bool(hf.get("mlp_bias", False)),
      qk_norm=model_type in ("qwen3", "qwen3_moe"),
      max_position_embeddings=hf.get("max_position_embeddings", 4096),
      dtype=check_dtype("dtype", dtype),
      param_dtype=check_dtype("param_dtype", param_dtype or dtype),
      remat=remat,
      attention=attention,
      bos_token_id=hf.get("bos_token_id"),
      eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
      pad_token_id=hf.get("pad_token_id"),
      **moe,
  )


def _moe_fields(hf: dict[str, Any], model_type: str) -> dict[str, Any]:
  """The MoE fields of a Qwen3-MoE or Mixtral config.json ({} for a dense model)."""
  if model_type not in MOE_MODEL_TYPES:
    return {}
  if model_type == "mixtral":
    if hf.get("sliding_window") is not None:
      raise ValueError(f"config.json sliding_window={hf['sliding_window']!r} is not supported; "
                       "expected null (full attention)")
    if float(hf.get("router_jitter_noise") or 0.0) != 0.0:
      raise ValueError(f"config.json router_jitter_noise={hf['router_jitter_noise']!r} is not "
                       "supported; expected 0")
    return dict(num_experts=hf["num_local_experts"], num_experts_per_tok=hf["num_experts_per_tok"],
                moe_intermediate_size=hf["intermediate_size"], norm_topk_prob=True,
                router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.0)))
  num_layers, step = hf["num_hidden_layers"], int(hf.get("decoder_sparse_step") or 1)
  dense = set(hf.get("mlp_only_layers") or ())
  experts = hf.get("num_experts") or hf.get("num_local_experts")  # transformers 5 writes the latter
  if not experts:
    raise ValueError(f"config.json num_experts={experts!r}: expected a positive number of "
                     "experts for model_type='qwen3_moe'")
  layers = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
  if not layers:
    raise ValueError(f"config.json decoder_sparse_step={step}, mlp_only_layers={sorted(dense)} "
                     "leave no MoE layer; expected at least one")
  return dict(num_experts=experts, num_experts_per_tok=hf["num_experts_per_tok"],
              moe_intermediate_size=hf["moe_intermediate_size"],
              norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
              moe_layers=None if len(layers) == num_layers else layers,
              router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.0)))


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                  "mixtral": "MixtralForCausalLM"}


def to_hf_dict(cfg: ModelConfig) -> dict[str, Any]:
  """Writes a `config.json` dict that transformers' Auto classes load."""
  if cfg.model_type == "qwen2" and (not cfg.qkv_bias or cfg.o_bias):
    raise ValueError("a qwen2 model must have qkv_bias=True and o_bias=False")
  if cfg.model_type != "qwen2" and cfg.qkv_bias != cfg.o_bias:
    raise ValueError(f"model_type={cfg.model_type!r} has one attention_bias flag: "
                     f"qkv_bias={cfg.qkv_bias} and o_bias={cfg.o_bias} must be equal")
  if cfg.qk_norm != (cfg.model_type in ("qwen3", "qwen3_moe")):
    raise ValueError(f"qk_norm={cfg.qk_norm} cannot be written as model_type={cfg.model_type!r}")
  rope = {"rope_type": "default", **cfg.rope_params, "rope_theta": cfg.rope_theta}
  hf = {
      "architectures": [_ARCHITECTURES[cfg.model_type]],
      "model_type": cfg.model_type,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": cfg.max_position_embeddings,
      "rms_norm_eps": cfg.rms_norm_eps,
      "tie_word_embeddings": cfg.tie_word_embeddings,
      # Both layouts, so transformers 4.x and 5.x read the same file.
      "rope_theta": cfg.rope_theta,
      "rope_scaling": None if rope["rope_type"] == "default" else {
          k: v for k, v in rope.items() if k != "rope_theta"},
      "rope_parameters": rope,
      "torch_dtype": cfg.param_dtype,
      "dtype": cfg.param_dtype,
      "bos_token_id": cfg.bos_token_id,
      "eos_token_id": list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple)
                      else cfg.eos_token_id,
      "pad_token_id": cfg.pad_token_id,
  }
  if cfg.model_type != "qwen2":
    hf["attention_bias"] = cfg.o_bias
  if cfg.model_type == "llama":
    hf["mlp_bias"] = cfg.mlp_bias
  elif cfg.mlp_bias:
    raise ValueError(f"mlp_bias=True cannot be written as model_type={cfg.model_type!r}")
  if cfg.model_type == "qwen3_moe":
    hf.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
              moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
              decoder_sparse_step=1, mlp_only_layers=[
                  i for i, kind in enumerate(cfg.layer_kinds) if kind == "dense"],
              router_aux_loss_coef=cfg.router_aux_loss_coef, output_router_logits=False,
              use_sliding_window=False)
  elif cfg.model_type == "mixtral":
    if not cfg.norm_topk_prob or cfg.num_moe_layers != cfg.num_layers:
      raise ValueError("a mixtral model has every layer MoE with norm_topk_prob=True; got "
                       f"moe_layers={cfg.moe_layers}, norm_topk_prob={cfg.norm_topk_prob}")
    hf.update(num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
              intermediate_size=cfg.moe_intermediate_size, sliding_window=None,
              router_jitter_noise=0.0, router_aux_loss_coef=cfg.router_aux_loss_coef,
              output_router_logits=False)
  return hf
