"""`validate(config)`: every value of a config checked once, before anything loads.

A bad value fails in seconds with one `ConfigError` naming the field, the value and
what was expected, not an hour into a run. Checks that belong to an object the library
builds from the config (the sampler's settings, the reward functions) are that object's
own: they run here by building it. The algorithm axes are checked in `algo_checks`, the
reward functions in `reward_checks`, the trackers in `logging_checks`.
"""
from __future__ import annotations

import math

import jax
from absl import logging

from jaxrl_llm import import_path, paths, platform, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.config import (algo_checks, env_checks, inputs, judge_checks, keys,
                              logging_checks, reward_checks, schema)
from jaxrl_llm.config.errors import ConfigError
from jaxrl_llm.config.errors import fail as _fail
from jaxrl_llm.config.errors import one_of as _one_of
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.data import char_tokenizer, prompts, sources
from jaxrl_llm.models import config as model_config
from jaxrl_llm.models import load as model_load

COMPLETION_SOURCES = ("sample", "dataset")  # config.data.completions
OPTIMIZERS = ("adamw",)
SCHEDULES = ("constant", "cosine")


def validate(config, devices=None, workdir: str | None = None, data: bool = False) -> None:
  """Raises `ConfigError` for the first section with a bad value.

  Args:
    config: a full config (`schema.base_config()` plus a preset's changes).
    devices: the devices of the mesh (default: all devices of all processes).
    workdir: also check that this run directory can be written (`check_writable`).
    data: also open and check the data the run reads (`inputs.check_inputs`).
  """
  try:
    keys.check_known_keys(config)
    _check_required(config)
    algo_checks.validate_algo(config.algo, config.sampling.num_samples)
    _check_optimizer(config.optimizer)
    _check_sizes(config)
    _check_sampling(config.sampling)
    _check_data(config)
    _check_processes(config, devices)
    _check_checkpoint(config.checkpoint)
    logging_checks.check_logging(config.logging)
    _check_batch_shards(config, devices)
    _check_context(config.mesh)
    _check_model(config.model)
    _check_lora(config)
    _check_sources(config)
    where = platform.device_platform((jax.devices() if devices is None else devices)[0])
    env_checks.check_envs(config, where)
    _check_routing_replay(config)
    _check_partial(config, where)
    _check_teacher(config)
    judge_checks.check_judge(config)
    _check_eval(config.eval)
    reward_checks.check_rewards(config)  # resolves the functions, checks the weights
    if workdir is not None:
      check_writable(workdir)
    if data:
      inputs.check_inputs(config)
  except ConfigError:
    raise
  except (ValueError, OSError, ImportError, AttributeError) as e:
    raise ConfigError(str(e)) from e


def _check_required(config) -> None:
  """Fields a preset left to the user (`schema.REQUIRED`), all named in one line."""
  def unset(group, prefix):
    for key in group.keys():
      value, name = group[key], f"{prefix}.{key}"
      if keys.is_group(value):
        yield from unset(value, name)
      elif value == schema.REQUIRED:
        yield name
  names = list(unset(config, "config"))
  if names:
    raise ConfigError(f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} required by "
                      f"this preset: set {'it' if len(names) == 1 else 'them'}, e.g. "
                      f"--{names[0]}=...")


# --- sections -------------------------------------------------------------------------------------
def _check_optimizer(opt) -> None:
  _one_of("optimizer.name", opt.name, OPTIMIZERS)
  _one_of("optimizer.schedule", opt.schedule, SCHEDULES)
  if not opt.lr > 0:
    _fail("optimizer.lr", opt.lr, "a positive learning rate")
  for name in ("b1", "b2"):
    if not 0 <= opt[name] < 1:
      _fail(f"optimizer.{name}", opt[name], "a decay rate in [0, 1)")
  if not opt.eps > 0:
    _fail("optimizer.eps", opt.eps, "> 0")
  if opt.warmup_steps < 0:
    _fail("optimizer.warmup_steps", opt.warmup_steps, ">= 0")
  if opt.grad_clip_norm < 0:
    _fail("optimizer.grad_clip_norm", opt.grad_clip_norm, ">= 0 (0 = off)")
  if opt.weight_decay < 0:
    _fail("optimizer.weight_decay", opt.weight_decay, ">= 0")


def _check_sizes(config) -> None:
  """Every count is positive, and the rollout batch splits into minibatches and micro-batches."""
  t, algo, s = config.train, config.algo, config.sampling
  positive = {"train.steps": t.steps, "train.prompts_per_step": t.prompts_per_step,
              "train.micro_batch_size": t.micro_batch_size, "train.log_every": t.log_every,
              "train.logprob_chunk_size": t.logprob_chunk_size,
              "sampling.num_samples": s.num_samples, "sampling.max_new_tokens": s.max_new_tokens,
              "sampling.max_prompt_len": s.max_prompt_len}
  for name, value in positive.items():
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      _fail(name, value, "a positive integer")
  for name in ("eval_every", "max_consecutive_skips"):
    if t[name] < 0:
      _fail(f"train.{name}", t[name], ">= 0 (0 = never)" if name == "eval_every" else ">= 0")
  if t.peak_flops_per_device < 0:
    _fail("train.peak_flops_per_device", t.peak_flops_per_device, ">= 0 (0 = measure)")
  B = t.prompts_per_step * sources_lib.rows_per_prompt(config)
  if B % algo.num_minibatches:
    raise ConfigError(f"config.algo.num_minibatches={algo.num_minibatches} does not divide the "
                      f"rollout batch of {B} sequences (train.prompts_per_step x "
                      f"sampling.num_samples{_times_agent_samples(config)}): expected a "
                      "divisor of it")
  minibatch = B // algo.num_minibatches
  if minibatch % min(t.micro_batch_size, minibatch):
    raise ConfigError(f"config.train.micro_batch_size={t.micro_batch_size} does not divide the "
                      f"minibatch of {minibatch} sequences: expected a divisor of it")


def _check_sampling(s) -> None:
  buckets = tuple(s.prompt_buckets)
  if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
    _fail("sampling.prompt_buckets", buckets, "a tuple of positive lengths")
  try:  # the settings check their own values (also for `sampling.generate`'s callers)
    sampling.settings.from_config(s, eos_ids=(), pad_id=0)
  except ValueError as e:
    raise ConfigError(f"config.sampling.{e}") from e


def _check_data(config) -> None:
  d = config.data
  _one_of("data.completions", d.completions, COMPLETION_SOURCES)
  _one_of("data.prompt_overflow", d.prompt_overflow, prompts.OVERFLOW_MODES)
  sources.parse_source(d.source)
  if d.completions == "dataset" and config.sampling.num_samples != 1:
    raise ConfigError(f"config.sampling.num_samples={config.sampling.num_samples}: completions "
                      "from the dataset (config.data.completions='dataset') give one target per "
                      "prompt; expected 1")


def _check_processes(config, devices) -> None:
  """Every process (host) loads its own share of the prompts; `devices`' hosts, or this
  run's processes."""
  P = config.train.prompts_per_step
  n = jax.process_count() if devices is None else len({d.process_index for d in devices})
  if P % n:
    raise ConfigError(f"config.train.prompts_per_step={P} is not divisible by the {n} processes: "
                      f"expected a multiple of {n} (each process loads its own share of the "
                      "prompts)")


def _check_checkpoint(c) -> None:
  if c.every < 0:
    _fail("checkpoint.every", c.every, ">= 0 (0 = only at the end)")
  if c.keep < 1:
    _fail("checkpoint.keep", c.keep, ">= 1")


def _check_batch_shards(config, devices) -> None:
  """The rollout rows split evenly over the mesh axes the 'batch' rule names."""
  mesh, _ = sh.split_meshes(config.mesh, devices)  # raises for a shape that does not fit
  rules = sh.freeze_rules(config.mesh.rules)
  sh.logical_to_spec((sh.BATCH,), (1,), mesh, rules)  # raises for an unknown axis in the rules
  axes = dict(rules).get(sh.BATCH) or ()
  axes = (axes,) if isinstance(axes, str) else axes
  shards = math.prod(mesh.shape[a] for a in axes)
  P, G = config.train.prompts_per_step, sources_lib.rows_per_prompt(config)
  sizes = " x ".join(f"{a}={mesh.shape[a]}" for a in axes)
  if (P * G) % shards:
    raise ConfigError(
        f"config.train.prompts_per_step={P} x config.sampling.num_samples="
        f"{config.sampling.num_samples}{_times_agent_samples(config)} = {P * G} rollout "
        f"rows do not split over the {shards} batch shards of the mesh ({sizes}, the axes "
        f"config.mesh.rules maps 'batch' to): expected a multiple of {shards}")
  minibatches = config.algo.num_minibatches
  if (P * G // minibatches) % shards:  # runs, but some devices repeat others' work
    logging.warning(
        "config.algo.num_minibatches=%d cuts the %d rollout rows into minibatches of %d, which "
        "do not split over the %d batch shards of the mesh (%s): each minibatch is split over "
        "fewer devices (replicated on the others); minibatches of a multiple of %d rows use "
        "every device", minibatches, P * G, P * G // minibatches, shards, sizes, shards)


def _check_context(mesh_cfg) -> None:
  """Context parallelism needs the 'seq' rule to name the context axis: otherwise its
  devices would each repeat the others' whole sequences."""
  rule = dict(mesh_cfg.rules).get(sh.SEQ) or ()
  if mesh_cfg.context != 1 and "context" not in ((rule,) if isinstance(rule, str) else rule):
    raise ConfigError(f"config.mesh.context={mesh_cfg.context} splits the sequence, but "
                      f"config.mesh.rules maps 'seq' to {rule or None!r}: expected 'context' "
                      "among its mesh axes, e.g. ('seq', 'context'), or context=1")


def _check_model(model_cfg) -> None:
  _one_of("model.remat", model_cfg.remat, model_config.REMAT_POLICIES)
  _one_of("model.attention", model_cfg.attention, model_config.ATTENTION_IMPLS)
  _one_of("model.moe_impl", model_cfg.moe_impl, model_config.MOE_IMPLS)
  _one_of("model.arch.model_type", model_cfg.arch.model_type, model_config.SUPPORTED_MODEL_TYPES)
  if model_cfg.router_z_loss_coef < 0:
    _fail("model.router_z_loss_coef", model_cfg.router_z_loss_coef, "a weight >= 0 (0 = off)")
  if model_cfg.router_aux_loss_coef < 0 and model_cfg.router_aux_loss_coef != -1:
    _fail("model.router_aux_loss_coef", model_cfg.router_aux_loss_coef,
          "a weight >= 0, or -1 for config.json's router_aux_loss_coef")
  a = model_cfg.arch
  if not model_cfg.path and a.model_type in model_config.MOE_MODEL_TYPES:
    if not 0 < a.num_experts_per_tok <= a.num_experts:
      _fail("model.arch.num_experts_per_tok", a.num_experts_per_tok,
            f"1 to model.arch.num_experts={a.num_experts} (an MoE arch needs num_experts > 0)")
    if a.moe_intermediate_size <= 0:
      _fail("model.arch.moe_intermediate_size", a.moe_intermediate_size, "a positive width")
  for name in ("dtype", "param_dtype"):
    _one_of(f"model.{name}", model_cfg[name], model_config.DTYPES)
  if model_cfg.path:
    _check_model_dir("model.path", model_cfg.path)
  if model_cfg.tokenizer_path and not paths.isdir(model_cfg.tokenizer_path):
    raise ConfigError(f"config.model.tokenizer_path={model_cfg.tokenizer_path!r} is not a "
                      "directory: expected a tokenizer directory, local or gs:// ('' = "
                      "model.path)")
  needed = len(char_tokenizer.vocab())
  if not model_cfg.path and not model_cfg.tokenizer_path and model_cfg.arch.vocab_size < needed:
    raise ConfigError(f"config.model.arch.vocab_size={model_cfg.arch.vocab_size} is smaller "
                      f"than the built-in character tokenizer's {needed} tokens: expected >= {needed}, "
                      "or set config.model.tokenizer_path")


def _policy_model_type(model_cfg) -> str | None:
  """The policy's model_type: its checkpoint's config.json's, or `config.model.arch`'s."""
  if model_cfg.path:
    return model_load.read_config(model_cfg.path).get("model_type")
  return model_cfg.arch.model_type


def _check_lora(config) -> None:
  lora = config.lora
  if lora.rank < 0 or lora.rank != int(lora.rank):
    _fail("lora.rank", lora.rank, "an integer >= 0 (0 = full fine-tuning)")
  if lora.rank == 0:
    if lora.base_quant != "none":
      _fail("lora.base_quant", lora.base_quant, "'none' without adapters (an int8 base "
            "cannot be trained; set config.lora.rank > 0)")
    return
  targets = model_config.lora_targets(lora.targets)
  bad = [t for t in targets if t not in model_config.LORA_TARGETS]
  if bad or not targets:
    _fail("lora.targets", lora.targets, f"'all' or comma-separated names from "
          f"{list(model_config.LORA_TARGETS)}")
  if lora.alpha <= 0:
    _fail("lora.alpha", lora.alpha, "a scale > 0")
  if not 0 <= lora.dropout < 1:
    _fail("lora.dropout", lora.dropout, "a probability in [0, 1)")
  _one_of("lora.base_quant", lora.base_quant, model_config.BASE_QUANTS)
  model_type = _policy_model_type(config.model)
  mlp = sorted({"gate_up_proj", "down_proj"} & set(targets))
  if mlp and model_type in model_config.MOE_MODEL_TYPES:
    _fail("lora.targets", lora.targets, f"attention targets only (qkv_proj, o_proj): the "
          f"policy is a mixture of experts (model_type={model_type!r}), whose experts carry "
          f"no adapters; drop {mlp}")


def _check_sources(config) -> None:
  """`config.sources`: the run-level fields they replace left alone, each source's data
  and per-row algorithm valid (errors name `config.sources.NAME....`; its rewards:
  `reward_checks`)."""
  errors = sources_lib.check_sources(config)
  if errors:
    raise ConfigError("; ".join(errors))
  for name, source in config.sources.items():
    field = f"sources.{name}"
    try:
      sources.parse_source(source.data)
      algo_checks.validate_algo(sources_lib.source_algo(config, name),
                                config.sampling.num_samples)
    except ValueError as e:
      message = str(e).replace("config.data.source", f"config.{field}.data")
      message = message.replace(" algo.advantage.", f" {field}.algo.advantage.")
      raise ConfigError(f"config.{field}: {'; '.join(message.splitlines())}") from e


def _check_routing_replay(config) -> None:
  """Routing replay needs an MoE policy and a sampler that records its experts."""
  if config.algo.routing_replay != "rollout":
    return
  model_type = _policy_model_type(config.model)
  if model_type not in model_config.MOE_MODEL_TYPES:
    _fail("algo.routing_replay", "rollout", f"'off': the policy (model_type={model_type!r}) is "
          f"not a mixture of experts (one of {list(model_config.MOE_MODEL_TYPES)})")
  # Both sampling engines, both episode players and the agent programs' endpoint record
  # the experts of every token they feed.


def _check_partial(config, where: str) -> None:
  """Partial rollouts stream samples, or episodes, through engines kept busy across steps
  (on platform `where`: `sampling.engine_kind`)."""
  if not config.rollouts.partial:  # a bool field: ml_collections refuses other types
    return
  why = None
  if config.algo.max_async_level < 1:
    why = "False, or config.algo.max_async_level >= 1 (generations span the publishes of the " \
          "asynchronous pipeline)"
  elif config.data.completions != "sample":
    why = "False: the rollouts are the dataset's completions (data.completions='dataset')"
  elif any(source.env.get("agent") for source in sources_lib.run_sources(config)):
    why = "False: an agent program's episodes do not span publishes yet (docs/agents.md)"
  elif (any(source.multi_turn for source in sources_lib.run_sources(config))
        and env_checks.episode_engine(config, where) == "turns"):
    why = (f"False, or sampling.engine='continuous' (episodes span publishes on the slot "
           f"engine; sampling.engine={config.sampling.engine!r} plays them turn by turn in "
           f"lockstep on {where})")
  elif config.algo.dynamic_sampling.enabled:
    why = "False, or algo.dynamic_sampling.enabled=False (a step takes the first groups to finish)"
  elif config.algo.routing_replay != "off":
    why = ("False, or algo.routing_replay='off' (a publish reroutes a sample's context "
           "midway, so no one record replays it; docs/moe.md)")
  elif config.sampling.top_k:
    why = f"False, or sampling.top_k=0 (the engine samples with temperature and top-p; got " \
          f"top_k={config.sampling.top_k})"
  if why:
    _fail("rollouts.partial", True, why)


def _times_agent_samples(config) -> str:
  """' x agent_samples=K' where an agent's episodes give K rows each, else ''."""
  k = sources_lib.rows_per_prompt(config) // config.sampling.num_samples
  return f" x agent_samples={k}" if k > 1 else ""


def _distill_readers(config, teachers=("model",)) -> list[str]:
  """The per-row settings that distil from one of `teachers`: `algo.distill` or each
  source's ('model' reads config.teacher; 'self', opsd, is the policy after a hint)."""
  groups = ([("algo.distill", config.algo.distill)] if not sources_lib.is_mixed(config) else
            [(f"sources.{n}.algo.distill", s.algo.distill) for n, s in config.sources.items()])
  return [f"{prefix}.{k} = {d[k]}" for prefix, d in groups for k in ("coef", "shaping_coef")
          if d[k] != 0 and d.teacher in teachers]


def _check_teacher(config) -> None:
  path = config.teacher.path
  readers = _distill_readers(config)
  distils = _distill_readers(config, ("model", "self"))
  if distils and config.data.completions != "sample":
    raise ConfigError(f"{distils[0]} distils on the policy's own samples: expected "
                      f"data.completions = 'sample', got {config.data.completions!r}")
  if readers and not path:
    raise ConfigError(f"{' and '.join(readers)} distil from a teacher, but config.teacher.path "
                      "is '': expected a Hugging Face checkpoint directory (local or gs://)")
  if path and not readers:
    raise ConfigError(f"config.teacher.path={path!r} is set but nothing reads it: expected "
                      "algo.distill.coef > 0 or algo.distill.shaping_coef > 0 with "
                      "algo.distill.teacher 'model' (per source with config.sources; or "
                      "teacher.path '')")
  if path:
    _check_model_dir("teacher.path", path)


def _check_model_dir(field: str, path: str) -> None:
  """A Hugging Face model directory (config.json and weights) whose architecture we read."""
  try:
    model_config.from_hf_dict(model_load.check_model_dir(path))
  except (OSError, ValueError) as e:
    raise ConfigError(f"config.{field}={path!r}: {e}") from e


def _check_eval(e) -> None:
  """`config.eval`: the samples per record, the k's of pass@k, the extractor."""
  K = e.num_samples
  if isinstance(K, bool) or not isinstance(K, int) or K < 0:
    _fail("eval.num_samples", K, "an integer >= 0 (0 = greedy evaluation only)")
  if len(e.pass_k) and K == 0:
    _fail("eval.pass_k", tuple(e.pass_k), "() when eval.num_samples is 0 (set "
          "eval.num_samples to the samples per record, at least the largest k)")
  bad = [k for k in e.pass_k if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= K]
  if bad:
    _fail("eval.pass_k", tuple(e.pass_k), f"each k an integer in [1, {K}] (eval.num_samples); "
          f"{bad[0]!r} is not")
  if not math.isfinite(e.correct_at):
    _fail("eval.correct_at", e.correct_at, "a finite reward total")
  if e.answer_extractor:
    import_path.load_function(e.answer_extractor, "config.eval.answer_extractor")


# --- workdir --------------------------------------------------------------------------------------
def check_writable(workdir: str) -> None:
  """Writes and removes a probe file: a bad workdir (a missing bucket, no permission)
  fails here, before the model loads."""
  try:
    paths.makedirs(workdir)
    probe = paths.join(workdir, f".write_test.{jax.process_index()}")  # one per process
    with paths.open(probe, "w") as f:
      f.write("ok")
    paths.remove(probe)
  except (OSError, ValueError) as e:  # gcsfs raises ValueError for some bad bucket names
    raise ConfigError(f"workdir {workdir!r} cannot be written ({type(e).__name__}: {e}): "
                      "expected a directory this process can create and write to") from e
