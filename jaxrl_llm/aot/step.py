"""The programs one training step runs, lowered for any devices from shapes alone.

`step_programs(config, setup)` gives every program the trainer would compile for `config`
(`training.set_up(..., abstract=True)` on the target's devices: nothing loads, nothing is
allocated): the sampler (the static engine's generate program for the longest prompt
bucket or the continuous engine's, or the multi-turn turn program), the evaluator's greedy
sampler, `prepare` (old, reference and teacher log-probs, values, advantages) and the
policy and value updates. Each is lowered with the jitted function the trainer runs
(`training.programs`, `sampling.Sampler`), at the recipe's real shapes: the longest prompt
bucket, every completion at `max_new_tokens`.

Beside its own arguments, a program shares HBM with what the run keeps between programs:
the train state, the frozen reference, base and teacher, and the KV buffers each sampler
keeps for its next call. `resident_buffers` sizes each per chip, and each program names
which of them it takes as arguments; the rest is resident beside it.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from jaxrl_llm import models, platform, sampling
from jaxrl_llm.models import expert_parallel
from jaxrl_llm.models import flops as model_flops
from jaxrl_llm import sharding as sh
from jaxrl_llm.training import flops, prepare, rollouts
from jaxrl_llm.training.rollouts import episodes
from jaxrl_llm.training.plan import Plan
from jaxrl_llm.training.setup import Setup

TRAINER, SAMPLER = "trainer", "sampler"  # placements: the trainer's chips, the sampler's own


@dataclasses.dataclass(frozen=True)
class StepProgram:
  """One program of a step.

  Attributes:
    name: 'sampler', 'turn', 'eval_sampler', 'prepare', 'policy_update' or 'value_update'.
    placement: TRAINER, or SAMPLER for the sampler's own chips (`config.mesh.rollout_devices`).
    lower: () -> its `jax.stages.Lowered`.
    arguments: the `resident_buffers` it takes as arguments (the rest stays beside it).
    calls_per_step: how often a training step runs it (0: not every step, the evaluator).
    decode_steps: the most iterations of its data-dependent loop (a decode loop that stops
      when every row has ended), or None without one.
    model_flops: model FLOPs of one call over all chips (`training.flops`).
    expert_share: the share of an MoE layer's experts a chip runs (`expert_parallel.
      local_share`): the part of its grouped matmuls' static buffers they compute.
  """
  name: str
  placement: str
  lower: Callable[[], Any]
  arguments: tuple[str, ...]
  calls_per_step: float
  decode_steps: int | None
  model_flops: float
  expert_share: float = 1.0


def bytes_per_chip(tree) -> int:
  """Bytes of a tree of `jax.ShapeDtypeStruct`s (with shardings) on its fullest device."""
  return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree))


def _settings(config, cfg, greedy: bool = False) -> sampling.SamplingSettings:
  """The sampler's settings as the trainer makes them (the stop ids do not change a
  program's shapes)."""
  eos = tuple(e for e in np.atleast_1d(cfg.eos_token_id) if e is not None)
  return sampling.settings.from_config(config.sampling, tuple(int(e) for e in eos),
                                      int(cfg.pad_token_id or 0), greedy=greedy)


def resident_buffers(config, plan: Plan, setup: Setup) -> dict[str, tuple[str, int]]:
  """What a run keeps in HBM between programs: name -> (placement, bytes per chip)."""
  m, layout = setup.models, setup.layout
  cfg = m.policy.config
  P, S0 = config.train.prompts_per_step, max(config.sampling.prompt_buckets)
  split = m.rollout_policy is not None
  out = {"policy": (TRAINER, bytes_per_chip(layout.policy_params)),
         "optimizer": (TRAINER, bytes_per_chip(layout.policy_opt))}
  if layout.value_params is not None:
    out["value"] = (TRAINER, bytes_per_chip((layout.value_params, layout.value_opt)))
  if m.reference is not None and m.base is None:  # with LoRA the reference is the base
    out["reference"] = (TRAINER, bytes_per_chip(m.reference.params))
  if m.base is not None:
    out["base"] = (TRAINER, bytes_per_chip(m.base))
  if m.teacher is not None:
    out["teacher"] = (TRAINER, bytes_per_chip(m.teacher.params))
  if split or plan.max_async_level > 0:  # copies the sampler samples from (`sampler_copy`)
    out["sampler_policy"] = (SAMPLER if split else TRAINER, max(1, plan.max_async_level)
                             * bytes_per_chip(sampler_params(setup)))
  if split and m.rollout_base is not None:
    out["sampler_base"] = (SAMPLER, bytes_per_chip(m.rollout_base))
  if plan.completions == "sample" and not _multi_turn(plan):
    sampler_model = m.rollout_policy if split else m.policy
    out["kv_cache"] = (SAMPLER if split else TRAINER, bytes_per_chip(
        sampling.Sampler(_settings(config, cfg)).cache_structs(sampler_model, P, S0)))
  if config.train.eval_every > 0 and not _multi_turn(plan):
    out["eval_kv_cache"] = (TRAINER, bytes_per_chip(
        sampling.Sampler(_settings(config, cfg, greedy=True)).cache_structs(m.policy, P, S0)))
  if plan.updates_per_step > 1:  # the step's batch waits while its minibatches are taken
    out["batch"] = (TRAINER, bytes_per_chip(prepared_batch(config, plan, setup)))
  return out


def sampler_params(setup: Setup):
  """The copy of the trained parameters the sampler gets with split placement or
  asynchronous rollouts (`setup.Models.sampler_copy`), as shapes."""
  m = setup.models
  params = setup.layout.policy_params
  if m.base is None:
    params = models.frozen_params(params, m.policy.config.jnp_dtype)
  return jax.tree.map(lambda x, where: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where),
                      params, m.sampler_shardings())


def _multi_turn(plan: Plan) -> bool:
  return any(s.multi_turn for s in plan.sources)


def _one_group(config, plan: Plan, cfg, where: str) -> rollouts.Rollout:
  """A rollout of one prompt's G rows at the largest shapes a step's rollout takes: the
  longest prompt bucket, every completion (or episode) at its most tokens, with the
  fields the plan's rollout source fills (`where`: the sampler's platform)."""
  s, G = config.sampling, config.sampling.num_samples
  S0, N = max(s.prompt_buckets), s.max_new_tokens
  multi = _multi_turn(plan)
  if multi:
    N = max(src.env["max_episode_tokens"] for src in plan.sources)
  zeros = lambda *shape, dtype=np.int32: np.zeros(shape, dtype)
  ones = lambda *shape: np.ones(shape, np.int32)
  routing = None
  if (cfg.is_moe and plan.completions == "sample" and not multi  # the static engine
      and sampling.engine_kind(_settings(config, cfg), "samples", where) == "static"):  # records the experts
    routing = zeros(G, S0 + N, cfg.num_moe_layers, cfg.num_experts_per_tok)
  hint = S0 + config.algo.distill.max_hint_len
  echo = multi and any(float(v) for v in config.algo.echo.values())
  lengths, truncated = np.full(G, N, np.int32), zeros(G, dtype=bool)
  return rollouts.Rollout(
      prompt_tokens=ones(1, S0), prompt_mask=ones(1, S0), tokens=ones(G, N), mask=ones(G, N),
      logprobs=zeros(G, N, dtype=np.float32) if plan.completions == "sample" else None,
      lengths=lengths, truncated=truncated, rewards=zeros(G, dtype=np.float32),
      group_valid=np.ones(1, bool), position=0, prompts=[""], completions=[""] * G,
      stats=rollouts.RolloutStats(lengths, truncated, zeros(1)), routing=routing,
      mixed=rollouts.Mixed(zeros(1), {}) if plan.mixed else None,
      hinted=rollouts.Hinted(ones(1, hint), ones(1, hint)) if plan.self_teacher else None,
      episodes=rollouts.EpisodeParts(
          ones(G, N), [], echo_weights=zeros(G, N, dtype=np.float32) if echo else None,
          turn_rewards=zeros(G, N, dtype=np.float32)) if multi else None)


def raw_batch(config, plan: Plan, setup: Setup) -> rollouts.TrainBatch:
  """The rollout's training rows as `prepare` receives them (`prepare.batch_arrays`, every
  process's rows), as shapes sharded over the trainer's batch axes."""
  m, G = setup.models, config.sampling.num_samples
  sampler = m.policy if m.rollout_policy is None else m.rollout_policy
  group = _one_group(config, plan, m.policy.config, platform.of(sampler.mesh))
  arrays = prepare.batch_arrays(group, G, plan.algo.overlong.mask_truncated)
  B = config.train.prompts_per_step * G
  rows = sh.rows_sharding(B, m.mesh, m.rules)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct((B,) + x.shape[1:], x.dtype,
                                                     sharding=rows), arrays)


def _prepare_arguments(config, plan: Plan, setup: Setup) -> tuple:
  """`programs.prepare`'s arguments: (raw batch, policy, reference, value, teacher,
  baselines)."""
  m, layout = setup.models, setup.layout
  value = None if m.value is None else m.value.replace(params=layout.value_params)
  return (raw_batch(config, plan, setup), m.trained_policy(layout.policy_params), m.reference,
          value, m.teacher, layout.baselines)


def prepared_batch(config, plan: Plan, setup: Setup) -> rollouts.TrainBatch:
  """The training batch `prepare` returns, as shapes."""
  return jax.eval_shape(setup.programs.prepare, *_prepare_arguments(config, plan, setup))[0]


def minibatch(config, plan: Plan, setup: Setup) -> rollouts.TrainBatch:
  """One update's minibatch, as shapes sharded over the trainer's batch axes."""
  m, rows = setup.models, setup.programs.minibatch_rows
  where = sh.rows_sharding(rows, m.mesh, m.rules)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct((rows,) + x.shape[1:], x.dtype,
                                                     sharding=where),
                      prepared_batch(config, plan, setup))


def _step_flops(config, plan: Plan, setup: Setup) -> dict[str, float]:
  """Model FLOPs of a step by phase (`training.flops.step_flops`), every completion at
  `max_new_tokens` (what the programs are compiled for), the update split into the
  policy's ('policy_update') and the critic's ('value_update')."""
  s, m = config.sampling, setup.models
  P, G, S0, N = config.train.prompts_per_step, s.num_samples, max(s.prompt_buckets), s.max_new_tokens
  work = flops.step_flops(
      m.policy.config, plan.algo, prompts=P, samples=G, prompt_len=S0, new_tokens=N,
      generated=P * G * N if plan.completions == "sample" else None,
      reference=plan.reference, value=plan.value_model,
      recompute_old_logp=plan.old_logp == "recompute",
      teacher_config=None if m.teacher is None else m.teacher.config)
  T, passes = S0 + N, 3 * plan.algo.num_iterations  # forward + backward, per pass
  work["policy_update"] = passes * model_flops.forward_flops(
      m.policy.config, P * G * T, (T + 1) / 2, unembedded=P * G * N)
  work["value_update"] = work["update"] - work["policy_update"]
  return work


def _decode_steps(settings: sampling.SamplingSettings, model: models.Model, prompts: int) -> int:
  """The most decode steps of one sampler call when every completion runs to
  `max_new_tokens`: N for the static engine; for the continuous one, each engine's requests
  pass through its slots in ceil(requests / slots) waves of N steps, with at most as many
  slots as its pages hold completions at the limit (`kv_pages`; preemptions' recompute not
  counted)."""
  N = settings.max_new_tokens
  if sampling.engine_kind(settings, "samples", platform.of(model.mesh)) == "static":
    return N
  shards = sampling.continuous.batch_shards(model, prompts)[1]
  requests = prompts * settings.num_samples
  slots = sampling.continuous.engine_slots(settings, requests, shards)
  slots = min(slots, sampling.page_pool.own_pages(settings, slots)
              // -(-N // settings.page_size))
  return -(-(requests // shards) // slots) * N


def _expert_share(model: models.Model) -> float:
  return expert_parallel.local_share(model.config, model.mesh, model.rules)


def _sampler_programs(config, plan: Plan, setup: Setup, step_flops: dict) -> list[StepProgram]:
  """The training sampler (or the turn program of multi-turn sources) and the evaluator's."""
  m, layout = setup.models, setup.layout
  P, S0 = config.train.prompts_per_step, max(config.sampling.prompt_buckets)
  cfg = m.policy.config
  split = m.rollout_policy is not None
  copied = split or plan.max_async_level > 0  # sampled from a copy, else from the state
  programs = []
  if _multi_turn(plan):
    programs.append(_turn_program(config, plan, setup, step_flops))
  elif plan.completions == "sample":
    settings = _settings(config, cfg)
    model = m.on_sampler(sampler_params(setup) if copied else layout.policy_params)
    sampler = sampling.Sampler(settings, config.sampling.prompt_buckets)
    arguments = (("sampler_policy", "sampler_base" if split else "base", "kv_cache") if copied
                 else ("policy", "base", "kv_cache"))
    programs.append(StepProgram(
        "sampler", SAMPLER if split else TRAINER,
        functools.partial(sampler.lower_shapes, model, P, S0), arguments, 1,
        _decode_steps(settings, model, P), step_flops["sample"], _expert_share(model)))
  if config.train.eval_every > 0 and not _multi_turn(plan):
    greedy = _settings(config, cfg, greedy=True)
    policy = m.trained_policy(layout.policy_params)
    evaluator = sampling.Sampler(greedy, config.sampling.prompt_buckets)
    programs.append(StepProgram(
        "eval_sampler", TRAINER, functools.partial(evaluator.lower_shapes, policy, P, S0),
        ("policy", "base", "eval_kv_cache"), 0, _decode_steps(greedy, policy, P),
        step_flops["sample"] / config.sampling.num_samples, _expert_share(policy)))
  return programs


def _turn_program(config, plan: Plan, setup: Setup, step_flops: dict) -> StepProgram:
  """The multi-turn turn program: each process plays its episodes on its first device with
  a whole copy of the policy (`training.rollouts.episodes.local_model`), its longest first turn
  (the opening prompt) into the largest cache the episodes may grow to."""
  m, layout = setup.models, setup.layout
  src = next(s for s in plan.sources if s.multi_turn)
  settings = sampling.turn_settings(_settings(config, m.policy.config), 0)
  T, N = src.env["max_episode_tokens"], settings.max_new_tokens
  device = m.mesh.devices.flat[0]
  hosts = len({d.process_index for d in m.mesh.devices.flat})
  rows = config.train.prompts_per_step // hosts * settings.num_samples
  one = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=SingleDeviceSharding(device))
  model = models.Model(jax.tree.map(one, m.trained_policy(layout.policy_params).params),
                       m.policy.config)
  turns = sampling.TurnSampler(settings, T + N, grow_to=2 * T + src.env["max_turns"] * (N + 8))

  def lower():  # a model without a mesh runs where the default device is: the target's
    with jax.default_device(device):
      return turns.lower_shapes(model, rows, T, turns.grow_to, place=one)
  return StepProgram("turn", TRAINER, lower, (), src.env["max_turns"], N,
                     step_flops["sample"] / src.env["max_turns"])


def step_programs(config, plan: Plan, setup: Setup) -> list[StepProgram]:
  """Every program a step of `config` runs, in the order a step runs them, for the devices
  of `setup` (`training.set_up(config, plan, devices, abstract=True)`)."""
  m, layout, programs = setup.models, setup.layout, setup.programs
  work = _step_flops(config, plan, setup)
  out = _sampler_programs(config, plan, setup, work)
  updates, share = plan.updates_per_step, _expert_share(m.policy)
  out.append(StepProgram(
      "prepare", TRAINER,
      lambda: programs.prepare.lower(*_prepare_arguments(config, plan, setup)),
      ("policy", "base", "reference", "value", "teacher"), 1, None, work["logprob"], share))
  out.append(StepProgram(
      "policy_update", TRAINER,
      lambda: programs.policy_update.lower(layout, minibatch(config, plan, setup), m.base),
      ("policy", "optimizer", "value", "base"), updates, None, work["policy_update"] / updates,
      share))
  if programs.value_update is not None:
    out.append(StepProgram(
        "value_update", TRAINER,
        lambda: programs.value_update.lower(layout, minibatch(config, plan, setup)),
        ("policy", "optimizer", "value"), updates, None, work["value_update"] / updates,
        _expert_share(m.value)))
  return out
