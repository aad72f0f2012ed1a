"""Set-up: the mesh, the models, the optimizer, the state's layout, the compiled programs
(where a run starts, fresh or resumed, is `resume`'s).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxrl_llm import data, models
from jaxrl_llm import sharding as sh
from jaxrl_llm.data import char_tokenizer
from jaxrl_llm.models import load, lora
from jaxrl_llm.models.config import MOE_MODEL_TYPES, ModelConfig, from_hf_dict, lora_targets
from jaxrl_llm.rewards import judge as judge_lib
from jaxrl_llm.training import programs as programs_lib
from jaxrl_llm.training import state as state_lib
from jaxrl_llm.training.plan import Plan


def model_config(model_cfg, path: str | None = None) -> ModelConfig:
  """The policy's architecture from `config.model` (`model_cfg`): its `path`'s config.json,
  or `arch`.

  `path`: another checkpoint's architecture (the teacher's) with the policy's numerics.
  """
  path = model_cfg.path if path is None else path
  if path:
    cfg = from_hf_dict(load.read_config(path), dtype=model_cfg.dtype,
                       param_dtype=model_cfg.param_dtype, remat=model_cfg.remat,
                       attention=model_cfg.attention)
  else:
    cfg = _arch_config(model_cfg)
  if not cfg.is_moe:
    return cfg
  aux = model_cfg.router_aux_loss_coef
  return cfg.replace(router_aux_loss_coef=cfg.router_aux_loss_coef if aux < 0 else aux,
                     router_z_loss_coef=model_cfg.router_z_loss_coef, moe_impl=model_cfg.moe_impl)


def load_judge(config) -> judge_lib.Judge | None:
  """`config.judge`'s model on this process's devices (its checkpoint's architecture in the
  policy's numerics): what scores in the place of the reward function the sources name
  (`rewards.judge`); None without `config.judge.path`."""
  if not config.judge.path:
    return None
  return judge_lib.Judge(config, model_config(config.model, config.judge.path))


def policy_config(config) -> ModelConfig:
  """The policy's architecture (`model_config`) with `config.lora`'s adapters and base."""
  cfg, l = model_config(config.model), config.lora
  if l.rank == 0:
    return cfg
  return cfg.replace(lora_rank=int(l.rank), lora_alpha=float(l.alpha),
                     lora_targets=lora_targets(l.targets), lora_dropout=float(l.dropout),
                     base_quant=l.base_quant)


def _with_adapters(config, policy: models.Model) -> models.Model:
  """The loaded policy with `config.lora`'s base storage and fresh adapters (or as it is)."""
  cfg = policy_config(config)
  if not cfg.has_lora:
    return policy
  if cfg.base_quant == "int8":
    policy = models.quantize_base(policy)
  return models.with_lora(policy, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets,
                          jax.random.fold_in(jax.random.PRNGKey(config.seed), 1),
                          cfg.lora_dropout)


def _arch_config(model_cfg) -> ModelConfig:
  """The built-in architecture `config.model.arch` with the numerics of `config.model`."""
  a = model_cfg.arch
  moe = {} if a.model_type not in MOE_MODEL_TYPES else dict(
      num_experts=a.num_experts, num_experts_per_tok=a.num_experts_per_tok,
      moe_intermediate_size=a.moe_intermediate_size, norm_topk_prob=a.norm_topk_prob)
  return ModelConfig(
      model_type=a.model_type, vocab_size=a.vocab_size, hidden_size=a.hidden_size,
      intermediate_size=a.intermediate_size, num_layers=a.num_layers, num_heads=a.num_heads,
      num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, rope_theta=a.rope_theta,
      rms_norm_eps=a.rms_norm_eps, tie_word_embeddings=a.tie_word_embeddings,
      max_position_embeddings=a.max_position_embeddings, qkv_bias=a.model_type == "qwen2",
      qk_norm=a.model_type in ("qwen3", "qwen3_moe"), dtype=model_cfg.dtype,
      param_dtype=model_cfg.param_dtype, remat=model_cfg.remat, attention=model_cfg.attention,
      eos_token_id=char_tokenizer.EOS_ID, pad_token_id=char_tokenizer.PAD_ID,
      bos_token_id=char_tokenizer.BOS_ID, **moe)


def load_tokenizer_and_policy(config, mesh, rules):
  """The policy (HF directory, or the in-config architecture) and its tokenizer."""
  model_cfg = config.model
  cfg = model_config(model_cfg)
  if model_cfg.path:
    policy = models.place(models.Model(load.load_params(model_cfg.path, cfg), cfg), mesh, rules)
  else:
    policy = models.init(cfg, jax.random.PRNGKey(config.seed), mesh=mesh, rules=rules)
  tokenizer = data.run_tokenizer(model_cfg)
  if len(tokenizer) > policy.config.vocab_size:
    given = model_cfg.tokenizer_path or model_cfg.path
    named = (f"config.model.tokenizer_path={given!r}" if given
             else "the built-in character tokenizer")
    size = "config.json's vocab_size" if model_cfg.path else "config.model.arch.vocab_size"
    raise ValueError(f"{named} has {len(tokenizer)} tokens but the model's vocab_size ({size}) "
                     f"is {policy.config.vocab_size}: expected a tokenizer of at most "
                     f"{policy.config.vocab_size} tokens; the tokenizer does not fit the model")
  return tokenizer, policy


@dataclasses.dataclass
class Models:
  """The models of a run, placed on one mesh.

  Attributes:
    mesh, rules: the device mesh and the logical-axis rules.
    policy, reference, value: `models.Model`s (reference/value None when the plan has
      none); the policy's and critic's trained parameters live in the train state. The
      reference is the initial policy in the compute dtype (`models.frozen`: the same
      outputs in half the memory under bf16 compute), or with LoRA the frozen base.
    rollout_policy: with split placement (`config.mesh.rollout_devices`), the policy's
      layout on the sampler's own mesh (shapes and shardings: the sampler gets a copy of
      the trained parameters, `sampler_copy`); None otherwise.
    teacher: the frozen teacher (`config.teacher.path`), sharded like the policy, in the
      compute dtype (`models.frozen`); None without one.
    base: with LoRA (`config.lora`), the policy's frozen parameters (all but the adapters,
      which are what the train state trains); None otherwise.
    rollout_base: `base` on the sampler's mesh (split placement with LoRA), else None.
  """
  mesh: Any
  rules: Any
  policy: models.Model
  reference: models.Model | None
  value: models.Model | None
  rollout_policy: models.Model | None = None
  teacher: models.Model | None = None
  base: Any = None
  rollout_base: Any = None

  def initial_trained(self):
    """The parameters the train state trains, as they start: the adapters with LoRA, else
    the whole policy."""
    return self.policy.params if self.base is None else lora.split(self.policy.params)[1]

  def trained_policy(self, params) -> models.Model:
    """The policy with the train state's `params` (the adapters beside the base with LoRA)."""
    return self.policy.replace(params=params if self.base is None else lora.join(self.base, params))

  def sampler_shardings(self):
    """Where the sampler keeps the trained parameters (the adapters with LoRA)."""
    where = self.policy if self.rollout_policy is None else self.rollout_policy
    shardings = jax.tree.map(lambda x: x.sharding, where.params)
    return shardings if self.base is None else lora.split(shardings)[1]

  def sampler_copy(self, params):
    """A copy of the trained `params` where the sampler keeps them (`sampler_shardings`;
    one copy across meshes, `sharding.transfer`), in the compute dtype (`models.frozen`:
    the decode casts every weight to it anyway, so it samples the same tokens from half
    the bytes); with LoRA the adapters alone, as they are (they merge in float32)."""
    if self.base is None:
      params = models.frozen_params(params, self.policy.config.jnp_dtype)
    return sh.transfer(params, self.sampler_shardings())

  def on_sampler(self, params) -> models.Model:
    """The policy the sampler runs, from trained `params` already on its devices
    (`sampler_copy`)."""
    if self.rollout_policy is None:
      return self.trained_policy(params)
    return self.rollout_policy.replace(
        params=params if self.rollout_base is None else lora.join(self.rollout_base, params))

  def sampling_policy(self, params) -> models.Model:
    """The policy with `params` where the sampler runs: a copy on the rollout mesh with
    split placement (`sampler_copy`), else as it is."""
    if self.rollout_policy is None:
      return self.trained_policy(params)
    return self.on_sampler(self.sampler_copy(params))


@dataclasses.dataclass
class Setup:
  """What a run is made of (made by `set_up`).

  Attributes:
    models: the placed models.
    tokenizer: the policy's tokenizer (None when abstract).
    schedule, optimizer: the learning-rate schedule (per optimizer update) and the optax
      transformation following it.
    layout: the TrainState's shapes, dtypes and shardings (`state.abstract_state`): where
      every program, fresh state and restored checkpoint keeps it.
    programs: the compiled programs of a step.
    base_fingerprint: LoRA's `lora.fingerprint` of the frozen base (None without one).
    judge: `config.judge`'s model, which scores the sources that name it (None without one).
  """
  models: Models
  tokenizer: Any
  schedule: Any
  optimizer: Any
  layout: state_lib.TrainState
  programs: programs_lib.Programs
  base_fingerprint: str | None = None
  judge: judge_lib.Judge | None = None


def set_up(config, plan: Plan, devices=None, abstract: bool = False) -> Setup:
  """The mesh, the models, the optimizer and the compiled programs of a (validated) config.

  `abstract`: shapes and shardings only (`jax.ShapeDtypeStruct`s for every parameter, no
  tokenizer): nothing loads and nothing is allocated, so a model too large for this
  machine can still be compiled and its memory analysed (bench/train_step.py).
  """
  mesh, rollout_mesh = sh.split_meshes(config.mesh, devices)
  rules = sh.freeze_rules(config.mesh.rules)
  abstract_model = lambda cfg: models.Model(models.abstract_params(cfg, mesh, rules), cfg, mesh,
                                            rules)
  if abstract:
    tokenizer, policy = None, abstract_model(policy_config(config))
  else:
    tokenizer, policy = load_tokenizer_and_policy(config, mesh, rules)
    policy = _with_adapters(config, policy)
  cfg = policy.config
  # LoRA: the base is frozen; with the adapters off it is the reference (no copy).
  base = lora.split(policy.params)[0] if cfg.has_lora else None
  base_model = None if base is None else policy.replace(params=base, config=cfg.without_lora())
  rollout_policy = reference = value = teacher = rollout_base = None
  if rollout_mesh is not None:  # the layout only: the sampler gets copies (`sampler_copy`)
    rollout_policy = models.Model(models.abstract_params(cfg, rollout_mesh, rules), cfg,
                                  rollout_mesh, rules)
    rollout_base = None if base is None else lora.split(rollout_policy.params)[0]
    if base is not None and not abstract:  # LoRA's frozen base, placed there once
      rollout_base = sh.transfer(base, jax.tree.map(lambda x: x.sharding, rollout_base))
  if plan.reference:  # the policy as it starts, in the compute dtype (`models.frozen`)
    reference = base_model if base is not None else models.frozen(policy)
  if plan.value_model:  # a critic trains every weight: a float copy of the policy's backbone
    value = (abstract_model(lora.merged_config(cfg).replace(head="value")) if abstract
             else models.value_model(policy if base is None else models.merged(base_model)))
  if plan.teacher:
    teacher_cfg = model_config(config.model, config.teacher.path)
    teacher = models.frozen(abstract_model(teacher_cfg) if abstract else models.place(
        models.Model(load.load_params(config.teacher.path, teacher_cfg), teacher_cfg), mesh,
        rules))
  judge = None if abstract else load_judge(config)  # a reward function's model
  trained = Models(mesh, rules, policy, reference, value, rollout_policy, teacher, base,
                   rollout_base)
  # One schedule: the optimizer follows it and the `lr` metric reads it.
  schedule = state_lib.make_schedule(config.optimizer, config.train.steps * plan.updates_per_step)
  optimizer = state_lib.make_optimizer(config.optimizer, schedule)
  abstract_policy = models.abstract_params(cfg, mesh, rules)
  layout = state_lib.abstract_state(
      optimizer, lora.split(abstract_policy)[1] if cfg.has_lora else abstract_policy,
      None if value is None else models.abstract_params(value.config, mesh, rules),
      num_baselines=plan.baselines)
  programs = programs_lib.compile_programs(config, plan, trained, optimizer, layout)
  fingerprint = None if base is None or abstract else lora.fingerprint(base)
  return Setup(trained, tokenizer, schedule, optimizer, layout, programs, fingerprint, judge)


def fresh_state(setup: Setup, seed: int) -> state_lib.TrainState:
  """The state a run starts from: the models' initial parameters, new optimizer states."""
  value = setup.models.value
  return state_lib.init_state(setup.optimizer, setup.models.initial_trained(),
                              None if value is None else value.params, seed, setup.layout)
