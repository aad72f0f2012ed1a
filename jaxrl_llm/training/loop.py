"""The RL training loop: sample -> reward -> advantages -> update -> log/eval/checkpoint.

`train(config, workdir)` runs every preset in `configs/`. What differs between
algorithms is data: `config.algo`'s axes decide which arrays a step needs (reference
log-probs only with a KL term, values only with a value model, recomputed old log-probs
only when asked), and the objectives read the axes. Nothing here branches on a name.

Every process runs this same loop (`jaxrl_llm.distributed`): each samples and scores
its own slice of the prompts, the update steps run on global arrays over one mesh,
process 0 alone writes logs, and orbax writes checkpoints from all processes.

Resume: a checkpoint holds the TrainState (parameters, optimizer, RNG key), the data
position and the skip counters; sampling keys are folded from the step, so a run
restarted from step s reproduces an uninterrupted run from s on. SIGTERM and non-finite
updates: see `guards`.

Asynchronous rollouts (`config.algo.max_async_level = k >= 1`): the sample + reward phase
runs ahead in a thread (`async_rollouts`), step s's rollout sampled by the policy after
update max(s - k, start); the loop takes it, then runs the same phases. A resumed run
restarts that pipeline from the checkpoint's policy and data position. Split placement
(`config.mesh.rollout_devices`) gives the sampler its own mesh (`sharding.split_meshes`).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import checkpoints, data, distributed, models, objectives, paths, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.data import char_tokenizer
from jaxrl_llm.models import load
from jaxrl_llm.models.config import ModelConfig, from_hf_dict
from jaxrl_llm.rewards import RewardSet
from jaxrl_llm.training import async_rollouts
from jaxrl_llm.training import flops as flops_lib
from jaxrl_llm.training import guards
from jaxrl_llm.training import metrics as metrics_lib
from jaxrl_llm.training import rollout as rollout_lib
from jaxrl_llm.training import state as state_lib
from jaxrl_llm.training import steps
from jaxrl_llm.training import validation


# --- set-up helpers ------------------------------------------------------------------------------
def uses_reference(algo) -> bool:
  return algo.kl.coef > 0 and algo.kl.placement != "none"


def uses_value_model(algo) -> bool:
  return algo.value.coef > 0


def model_config(config) -> ModelConfig:
  """The policy's architecture: `config.model.path`'s config.json, or `config.model.arch`."""
  m = config.model
  if m.path:
    return from_hf_dict(load.read_config(m.path), dtype=m.dtype, param_dtype=m.param_dtype,
                        remat=m.remat, attention=m.attention)
  a = m.arch
  return ModelConfig(
      model_type=a.model_type, vocab_size=a.vocab_size, hidden_size=a.hidden_size,
      intermediate_size=a.intermediate_size, num_layers=a.num_layers, num_heads=a.num_heads,
      num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, rope_theta=a.rope_theta,
      rms_norm_eps=a.rms_norm_eps, tie_word_embeddings=a.tie_word_embeddings,
      max_position_embeddings=a.max_position_embeddings, qkv_bias=a.model_type == "qwen2",
      qk_norm=a.model_type == "qwen3", dtype=m.dtype, param_dtype=m.param_dtype,
      remat=m.remat, attention=m.attention, eos_token_id=char_tokenizer.EOS_ID,
      pad_token_id=char_tokenizer.PAD_ID, bos_token_id=char_tokenizer.BOS_ID)


def load_tokenizer_and_policy(config, mesh, rules):
  """The policy (HF directory, or the in-config architecture) and its tokenizer."""
  m = config.model
  cfg = model_config(config)
  if m.path:
    policy = models.place(models.Model(load.load_params(m.path, cfg), cfg), mesh, rules)
    tokenizer = data.load_tokenizer(m.tokenizer_path or m.path)
  else:
    policy = models.init(cfg, jax.random.PRNGKey(config.seed), mesh=mesh, rules=rules)
    tokenizer = (data.load_tokenizer(m.tokenizer_path) if m.tokenizer_path
                 else char_tokenizer.build_char_tokenizer(vocab_size=cfg.vocab_size))
  if len(tokenizer) > policy.config.vocab_size:
    source = (f"config.model.tokenizer_path={m.tokenizer_path or m.path!r}" if m.path or
              m.tokenizer_path else "the built-in character tokenizer")
    size = "config.json's vocab_size" if m.path else "config.model.arch.vocab_size"
    raise ValueError(f"{source} has {len(tokenizer)} tokens but the model's vocab_size ({size}) "
                     f"is {policy.config.vocab_size}: expected a tokenizer of at most "
                     f"{policy.config.vocab_size} tokens; the tokenizer does not fit the model")
  return tokenizer, policy


def _fingerprint(policy: models.Model, with_value: bool) -> dict[str, Any]:
  """What a checkpoint's state shapes depend on; a resume must match it."""
  c = policy.config
  return {"model": {k: v for k, v in dataclasses.asdict(c).items()
                    if k not in ("remat", "attention", "bos_token_id", "eos_token_id", "pad_token_id")},
          "param_layout": models.PARAM_LAYOUT, "value_model": with_value}


def _differences(saved, wanted, prefix="") -> str:
  """'model.hidden_size: 64 in the checkpoint, 32 in this config; ...' for two fingerprints."""
  if isinstance(saved, dict) and isinstance(wanted, dict):
    parts = [_differences(saved.get(k), wanted.get(k), f"{prefix}{k}.")
             for k in sorted(set(saved) | set(wanted))]
    return "; ".join(p for p in parts if p)
  if saved == wanted or (isinstance(saved, list) and tuple(saved) == wanted):
    return ""
  return f"{prefix[:-1]}: {saved!r} in the checkpoint, {wanted!r} in this config"


def batch_arrays(r: rollout_lib.Rollout, G: int, mask_truncated: bool) -> dict[str, np.ndarray]:
  """The rollout as training rows: prompt + completion, masks, sampler log-probs.

  Prompts are left-padded to the longest prompt block of any process, so that every
  process's rows have the global batch's shape.
  """
  extra = distributed.max_int(r.prompt_tokens.shape[1]) - r.prompt_tokens.shape[1]
  prompt_tokens = np.repeat(np.pad(r.prompt_tokens, ((0, 0), (extra, 0))), G, axis=0)
  prompt_mask = np.repeat(np.pad(r.prompt_mask, ((0, 0), (extra, 0))), G, axis=0)
  loss_mask = r.mask * np.repeat(r.group_valid, G)[:, None]
  if mask_truncated:
    loss_mask = loss_mask * (~r.truncated)[:, None]
  out = {
      "tokens": np.concatenate([prompt_tokens, r.tokens], axis=1).astype(np.int32),
      "attention_mask": np.concatenate([prompt_mask, r.mask], axis=1).astype(np.int32),
      "loss_mask": loss_mask.astype(np.int32),
      "rewards": r.rewards.astype(np.float32),  # [B]: every batch array's first axis is its rows
  }
  if r.logprobs is not None:
    out["sampler_logp"] = r.logprobs.astype(np.float32)
  return out


def place_batch(arrays: dict[str, np.ndarray], mesh, rules) -> dict[str, jax.Array]:
  """Each process's rows -> global arrays sharded over the batch axis."""
  return {k: sh.put_process_rows(v, (sh.BATCH,) + (None,) * (v.ndim - 1), mesh, rules)
          for k, v in arrays.items()}


def old_logp_source(config) -> str:
  """'sampler' or 'recompute': where a batch's old log-probs come from (`config.algo.old_logp`).

  'auto' recomputes them with the trainer's forward when the model computes below float32
  and the loss has an importance ratio, as verl does. Measured on the demo's task with GSPO
  in bf16 (ratio clipped to [1 - 3e-4, 1 + 4e-4]), first pass, where the ratio is 1 by
  definition: the sampler's log-probs (a decode with a KV cache) clip 1% of the sequences,
  the recomputed ones none (the same forward as the update's, bit for bit:
  `models.COMPILER_OPTIONS`); a truncated IS weight against the sampler's would leave that
  1% clipped. In float32 both agree to ~1e-5, and the sampler's save a forward pass.
  A behaviour mask (`algo.behaviour_mask`) also resolves to 'recompute': it compares the
  policy at the start of the update with the recorded behaviour log-probs (ALGORITHMS.md).
  Asynchronous rollouts alone do not: the ratio then centres on the (up to k updates
  older) behaviour policy, which saves the forward; set 'recompute' to centre it on the
  current one.
  """
  source = config.algo.old_logp
  if source != "auto":
    return source
  low_precision = config.model.dtype != "float32"
  masked = config.algo.behaviour_mask.level != "off"
  return ("recompute" if (low_precision or masked) and config.algo.loss.ratio != "none"
          else "sampler")


def training_algo(config):
  """`config.algo` with `old_logp` resolved (`old_logp_source`): what the steps read."""
  algo = config.algo.copy_and_resolve_references()
  algo.old_logp = old_logp_source(config)
  return algo


def _needs_old_logp(algo) -> bool:
  """Whether a batch without sampler log-probs needs them recomputed.

  Only an importance ratio, the KL-in-reward term, or an explicit
  `algo.old_logp='recompute'` read them. Otherwise (SFT: targets from the dataset, ratio
  `none`) the update takes `old_logp` = its own log-probs, stop-gradient, which is what
  a recomputation gives for the first update and saves a forward pass per step.
  """
  return (algo.loss.ratio != "none" or algo.old_logp == "recompute"
          or (algo.kl.coef > 0 and algo.kl.placement == "reward"))


def _prepare(batch, policy, reference, value, *, algo, num_samples, temperature, chunk_size,
             num_micro):
  """Old/reference log-probs, values and advantages of a rollout batch (one program).

  The forwards run on the update's micro-batch shapes (`steps.map_micro`, `num_micro`
  pieces), so recomputed old log-probs equal the update's first forward bit for bit.
  Returns (the training batch, metrics: `behaviour_mask_frac` when a behaviour mask
  applies).
  """
  out = dict(batch)
  mask = batch["loss_mask"]
  logp = lambda model: steps.map_micro(
      lambda piece: steps.completion_logp(model, piece, temperature=temperature,
                                          chunk_size=chunk_size)[0], batch, num_micro)
  if "sampler_logp" in batch and algo.old_logp == "sampler":
    old_logp = jnp.where(mask > 0, batch["sampler_logp"], 0.0)
  elif _needs_old_logp(algo):
    old_logp = jnp.where(mask > 0, logp(policy), 0.0)
  else:  # SFT: no behaviour log-probs and nothing reads them; the step uses its own
    old_logp = None
  ref_logp = values = None
  if reference is not None:
    ref_logp = jnp.where(mask > 0, logp(reference), 0.0)
  if value is not None:
    values = steps.map_micro(lambda piece: steps.completion_values(value, piece), batch,
                             num_micro)
  rewards_PG = batch["rewards"].reshape(-1, num_samples)
  adv, returns = objectives.token_advantages(rewards_PG, mask, algo, logp_BT=old_logp,
                                             ref_logp_BT=ref_logp, values_BT=values)
  metrics = {}
  corrects = "sampler_logp" in batch and algo.old_logp == "recompute"
  if algo.tis_cap > 0 and corrects:
    adv = adv * objectives.truncated_importance_weight(old_logp, batch["sampler_logp"], algo.tis_cap)
  if algo.behaviour_mask.level != "off" and corrects:  # after the advantages: baselines keep
    out["loss_mask"], metrics["behaviour_mask_frac"] = objectives.behaviour_mask(  # every reward
        old_logp, batch["sampler_logp"], mask, algo.behaviour_mask)
  out["advantages"] = adv
  if old_logp is not None:
    out["old_logp"] = old_logp
  if ref_logp is not None and algo.kl.placement == "loss":
    out["ref_logp"] = ref_logp
  if values is not None:
    out.update(old_values=values, returns=returns)
  out.pop("rewards")
  out.pop("sampler_logp", None)
  return out, metrics


def _throughput(model_config, algo, rollout, arrays, *, dt, t_sample, t_logprob, t_update, G, N,
                reference, value, peak) -> dict[str, float]:
  """Step times, tokens per second and model-FLOP utilisation of a step (`flops`).

  `peak`: the FLOP/s of all the mesh's devices together.
  """
  P = len(rollout.prompts) * jax.process_count()
  sampled = rollout.logprobs is not None
  lengths = float(distributed.concat(rollout.lengths).sum())
  generated = lengths if sampled else None
  step = flops_lib.step_flops(
      model_config, algo, prompts=P, samples=G, prompt_len=arrays["tokens"].shape[1] - N,
      new_tokens=N, generated=generated, reference=reference, value=value,
      recompute_old_logp=_recomputes_old_logp(algo, sampled))
  train_tokens = float(distributed.sum_int(int(arrays["loss_mask"].sum())))
  return dict(step_time_s=dt, sample_time_s=t_sample, logprob_time_s=t_logprob,
              update_time_s=t_update, mfu=step["total"] / dt / peak,
              update_mfu=step["update"] / max(t_update, 1e-9) / peak,
              train_tokens_per_s=train_tokens * algo.num_iterations / max(t_update, 1e-9),
              sample_tokens_per_s=lengths / max(t_sample, 1e-9))


def _recomputes_old_logp(algo, sampled: bool) -> bool:
  """Whether `_prepare` runs the policy forward for old log-probs (see `_needs_old_logp`)."""
  return _needs_old_logp(algo) and not (sampled and algo.old_logp == "sampler")


# --- set-up and compiled steps ----------------------------------------------------------------
@dataclasses.dataclass
class Models:
  """What a run trains and scores with, placed on one mesh (made by `set_up`).

  Attributes:
    mesh, rules: the device mesh and the logical-axis rules.
    tokenizer: the policy's tokenizer.
    policy, reference, value: `models.Model`s (reference/value None when `config.algo`
      needs none); the policy's and critic's trained parameters live in `state`.
    schedule, optimizer: the learning-rate schedule (per optimizer update) and the optax
      transformation following it.
    state: a fresh `TrainState`, sharded like the parameters.
    rollout_policy: with split placement (`config.mesh.rollout_devices`), the policy placed
      on the sampler's own mesh (a copy of the initial parameters); None otherwise.
  """
  mesh: Any
  rules: Any
  tokenizer: Any
  policy: models.Model
  reference: models.Model | None
  value: models.Model | None
  schedule: Any
  optimizer: Any
  state: state_lib.TrainState
  rollout_policy: models.Model | None = None

  def sampling_policy(self, params) -> models.Model:
    """The policy with `params` where the sampler runs: on the rollout mesh (one
    `device_put` across meshes) with split placement, else as it is."""
    if self.rollout_policy is None:
      return self.policy.replace(params=params)
    shardings = jax.tree.map(lambda x: x.sharding, self.rollout_policy.params)
    return self.rollout_policy.replace(params=jax.device_put(params, shardings))


def set_up(config, devices=None) -> Models:
  """The mesh, the models and a fresh train state of a (validated) config."""
  algo, t = config.algo, config.train
  mesh, rollout_mesh = sh.split_meshes(config.mesh, devices)
  rules = sh.freeze_rules(config.mesh.rules)
  tokenizer, policy = load_tokenizer_and_policy(config, mesh, rules)
  rollout_policy = None if rollout_mesh is None else models.place(policy, rollout_mesh, rules)
  reference = (policy.replace(params=jax.tree.map(jnp.copy, policy.params))
               if uses_reference(algo) else None)
  value = models.value_model(policy) if uses_value_model(algo) else None
  # One schedule: the optimizer follows it and the `lr` metric reads it.
  schedule = state_lib.make_schedule(
      config.optimizer, t.steps * algo.num_iterations * algo.num_minibatches)
  optimizer = state_lib.make_optimizer(config.optimizer, schedule)
  state = state_lib.init_state(policy.params, None if value is None else value.params,
                               optimizer, optimizer, config.seed)
  # Parameters and optimizer moments are already sharded; counters and the key replicate.
  state = jax.device_put(state, jax.tree.map(
      lambda x: x.sharding if isinstance(x.sharding, jax.sharding.NamedSharding)
      else sh.replicated(mesh), state))
  return Models(mesh, rules, tokenizer, policy, reference, value, schedule, optimizer, state,
                rollout_policy)


@dataclasses.dataclass
class Steps:
  """The jitted programs of a step (made by `jit_steps`); see `train` for their order."""
  prepare: Any
  policy_update: Any
  value_update: Any
  take_rows: Any
  next_step: Any
  minibatch_rows: int


def jit_steps(config, m: Models) -> Steps:
  """Every program states where its inputs and outputs live.

  Batch rows are sharded over the mesh's batch axes (each minibatch too), parameters and
  optimizer state stay where they are placed (the state is donated), metrics come back
  replicated and stay on the devices until a step is logged.
  """
  algo, t, s = training_algo(config), config.train, config.sampling
  B = t.prompts_per_step * s.num_samples
  placed = lambda model: None if model is None else model.replace(
      params=jax.tree.map(lambda x: x.sharding, model.params))
  state_shardings = jax.tree.map(lambda x: x.sharding, m.state)
  minibatch_rows = B // algo.num_minibatches
  rows, minibatch = (sh.rows_sharding(B, m.mesh, m.rules),
                     sh.rows_sharding(minibatch_rows, m.mesh, m.rules))
  repl = sh.replicated(m.mesh)
  micro_rows = min(t.micro_batch_size, minibatch_rows)
  num_micro = minibatch_rows // micro_rows
  update = lambda fn, model, **kw: jax.jit(
      functools.partial(fn, model_static=model.replace(params=None), algo=algo,
                        optimizer=m.optimizer, num_micro=num_micro, **kw),
      in_shardings=(state_shardings, minibatch), out_shardings=(state_shardings, repl),
      donate_argnums=(0,), compiler_options=models.COMPILER_OPTIONS)
  return Steps(
      prepare=jax.jit(functools.partial(_prepare, algo=algo, num_samples=s.num_samples,
                                        temperature=s.temperature, chunk_size=t.logprob_chunk_size,
                                        num_micro=B // micro_rows),
                      in_shardings=(rows, placed(m.policy), placed(m.reference), placed(m.value)),
                      out_shardings=(rows, repl), compiler_options=models.COMPILER_OPTIONS),
      policy_update=update(steps.policy_step, m.policy, temperature=s.temperature,
                           chunk_size=t.logprob_chunk_size),
      value_update=None if m.value is None else update(steps.value_step, m.value),
      take_rows=jax.jit(lambda batch, idx: jax.tree.map(lambda x: x[idx], batch),
                        in_shardings=(rows, repl), out_shardings=minibatch),
      next_step=jax.jit(steps.next_step, in_shardings=(state_shardings,),
                        out_shardings=state_shardings, donate_argnums=(0,)),
      minibatch_rows=minibatch_rows)


# --- the loop -------------------------------------------------------------------------------------
def train(config, workdir: str, devices=None) -> dict[str, float]:
  """Runs (or resumes) the experiment `config` in `workdir`; returns the last metrics.

  Args:
    config: a full config (see `configs/`).
    workdir: a local directory or a gs:// URL; checkpoints, metrics.jsonl, tb/ and
      export/ go here; a workdir that holds checkpoints is resumed from the latest.
    devices: the devices of the mesh (default: all devices of all processes).
  """
  # ---------------------------------------------------------------- Set-up
  validation.validate_config(config, devices)
  validation.check_writable(workdir)
  algo, t, s = training_algo(config), config.train, config.sampling
  G, P, N = s.num_samples, t.prompts_per_step, s.max_new_tokens
  if jax.process_index() == 0:
    paths.write_atomic(paths.join(workdir, "config.json"), config.to_json_best_effort(indent=2))
  m = set_up(config, devices)
  mesh, rules, tokenizer, policy, reference, value = (m.mesh, m.rules, m.tokenizer, m.policy,
                                                      m.reference, m.value)
  state, schedule = m.state, m.schedule
  sampling_policy = m.sampling_policy  # (`m` names minibatches below)
  eos, pad = rollout_lib.eos_ids(tokenizer, policy.config), rollout_lib.pad_id(tokenizer)
  updates_per_step = algo.num_iterations * algo.num_minibatches

  ckpt = checkpoints.Checkpointer(workdir, config.checkpoint)
  fingerprint = _fingerprint(policy, value is not None)
  start, position, skips = 0, 0, {}
  latest = ckpt.latest_step()
  if latest is not None:
    meta = ckpt.read_meta(latest)
    if meta.get("fingerprint") != fingerprint:
      raise ValueError(f"the checkpoint at step {latest} in {workdir!r} was written by an "
                       f"incompatible config: {_differences(meta.get('fingerprint'), fingerprint)}; "
                       "expected the same model (or a fresh workdir)")
    state, meta = ckpt.restore(latest, checkpoints.abstract_of(state))
    start, position = int(meta["step"]), int(meta["data_position"])
    skips = {k: int(meta.get(k, 0)) for k in ("skipped_steps", "consecutive_skips")}

  load_records = {"sample": data.load_dataset, "dataset": data.load_demonstrations}
  train_data = load_records[config.data.completions](config.data, "train",
                                                     task_options=config.data.task_options)
  batches = data.prompt_batches(train_data, P, seed=config.data.shuffle_seed, start=position,
                                process_index=jax.process_index(),
                                process_count=jax.process_count())
  settings = sampling.SamplingSettings(G, N, s.temperature, s.top_k, s.top_p, eos, pad,
                                       s.layer_loop, s.weight_layout)
  sampler = sampling.Sampler(settings, s.prompt_buckets)
  if config.data.completions == "sample":
    rollouts = rollout_lib.SampledRollouts(config, tokenizer, batches, sampler,
                                           RewardSet.from_config(config.rewards))
  else:
    rollouts = rollout_lib.DatasetRollouts(config, tokenizer, batches, eos)
  evaluator = (Evaluator(config, tokenizer, eos, pad) if t.eval_every > 0 else None)
  step_key = lambda step: jax.random.fold_in(jax.random.PRNGKey(config.seed), step)
  pipeline = None
  if algo.max_async_level > 0:  # sampling runs ahead in a thread (`async_rollouts`)
    sampler_policy = policy if m.rollout_policy is None else m.rollout_policy
    pipeline = async_rollouts.RolloutPipeline(
        rollouts, sampler_policy, start=start, steps=t.steps,
        max_async_level=algo.max_async_level, step_key=step_key)
  staleness: list[int] = []  # per step since the last log

  # ---------------------------------------------------------------- Compiled steps
  as_policy = lambda st: policy.replace(params=st.policy_params)
  as_value = lambda st: None if value is None else value.replace(params=st.value_params)
  programs = jit_steps(config, m)
  minibatch_rows = programs.minibatch_rows

  peak, peak_source = flops_lib.peak_flops_per_device(mesh.devices.flatten().tolist(),
                                                      t.peak_flops_per_device)
  guard = guards.NonFiniteGuard(t.max_consecutive_skips, skips.get("skipped_steps", 0),
                                skips.get("consecutive_skips", 0))
  writer = metrics_lib.MetricsWriter(workdir, config.logging, t.steps, start)
  writer.print(f"mfu: model FLOPs against {peak / 1e12:.3g} TFLOP/s per device ({peak_source})")
  if _needs_old_logp(algo):
    writer.print(f"old log-probs: {algo.old_logp} (config.algo.old_logp={config.algo.old_logp!r}, "
                 f"compute dtype {config.model.dtype})")
  preemption = guards.PreemptionWatch()
  preemption.install()
  row: dict[str, float] = {}
  try:
    if pipeline is not None:
      pipeline.publish(start, state.policy_params)
    if evaluator is not None and start == 0:  # the starting point, as step 0
      row = evaluator(as_policy(state))
      writer.print(evaluator.table_row(0, row))
      writer.write(0, row)
    for step in range(start, t.steps):
      t_step = time.perf_counter()
      # ---------------------------------------------------------------- Sample + reward
      t0 = time.perf_counter()  # with a pipeline: the time spent waiting for the rollout
      if pipeline is None:
        rollout = rollouts(sampling_policy(state.policy_params), step_key(step))
      else:
        rollout = pipeline.get(step)
        staleness.append(step - rollout.policy_version)
      t_reward = rollout.metrics.pop("reward_time_s", 0.0)
      # With a pipeline the reward ran in its thread: the wait is all this step spent.
      t_sample = time.perf_counter() - t0 - (t_reward if pipeline is None else 0.0)
      # ---------------------------------------------------------------- Log-probs, advantages
      t0 = time.perf_counter()
      arrays = batch_arrays(rollout, G, algo.overlong.mask_truncated)
      batch, prepare_metrics = programs.prepare(place_batch(arrays, mesh, rules),
                                                as_policy(state), reference, as_value(state))
      jax.block_until_ready(batch)
      t_logprob = time.perf_counter() - t0
      # ---------------------------------------------------------------- Update
      t0 = time.perf_counter()
      step_metrics = []
      perm_rng = np.random.default_rng([config.seed, step])
      for _ in range(algo.num_iterations):
        order = perm_rng.permutation(P * G) if algo.num_minibatches > 1 else np.arange(P * G)
        for m in range(algo.num_minibatches):
          idx = order[m * minibatch_rows:(m + 1) * minibatch_rows]
          piece = programs.take_rows(batch, idx) if algo.num_minibatches > 1 else batch
          state, pm = programs.policy_update(state, piece)
          if programs.value_update is not None:
            state, vm = programs.value_update(state, piece)
            pm = {**pm, **vm}
          step_metrics.append(pm)
      state = programs.next_step(state)
      if pipeline is not None:
        pipeline.publish(step + 1, state.policy_params)
      # The guard sees every step's non-finite flags (a few scalars); the rest waits for a log.
      guard_row = guard.update(step + 1, jax.device_get(
          [{k: m[k] for k in guards.NONFINITE_FLAGS if k in m} for m in step_metrics]))
      t_update = time.perf_counter() - t0
      # ---------------------------------------------------------------- Log, eval, checkpoint
      done = step + 1
      dt = time.perf_counter() - t_step
      if done % t.log_every == 0 or done == t.steps or guard.consecutive:
        step_metrics = jax.device_get(step_metrics)
        row = {k: float(np.mean([m[k] for m in step_metrics])) for k in step_metrics[-1]}
        row.update(rollout.metrics, **guard_row, **jax.device_get(prepare_metrics))
        row.update(_throughput(policy.config, algo, rollout, arrays, dt=dt, t_sample=t_sample,
                               t_logprob=t_logprob, t_update=t_update, G=G, N=N,
                               reference=reference is not None, value=value is not None,
                               peak=peak * mesh.size))
        row.update(lr=float(schedule(done * updates_per_step - 1)), reward_time_s=t_reward,
                   data_position=rollout.position)
        if pipeline is not None:
          row.update({"async/staleness_mean": float(np.mean(staleness)),
                      "async/staleness_max": float(np.max(staleness)),
                      "async/policy_version": float(rollout.policy_version)})
          staleness = []
        if evaluator is not None and (done % t.eval_every == 0 or done == t.steps):
          row.update(evaluator(as_policy(state)))
          writer.print(evaluator.table_row(done, row))
        writer.write(done, row)
      elif evaluator is not None and done % t.eval_every == 0:
        writer.print(evaluator.table_row(done, evaluator(as_policy(state))))
      guard.check(done)
      preempted = preemption.requested() and done < t.steps
      if ckpt.due(done, last=done == t.steps) or preempted:
        ckpt.save(done, state, {"step": done, "data_position": rollout.position,
                                "fingerprint": fingerprint, **guard.state()})
      if preempted:
        ckpt.wait()
        raise guards.Preempted(done)
    # ---------------------------------------------------------------- Export
    ckpt.wait()
    export = paths.join(workdir, "export")
    models.save_pretrained(as_policy(state), export)
    if jax.process_index() == 0:
      with paths.local_staging(export) as local:  # transformers writes local files only
        tokenizer.save_pretrained(local)
  finally:
    if pipeline is not None:
      pipeline.close()
    preemption.uninstall()
    ckpt.close()
    writer.close()
  return row


class Evaluator:
  """Greedy completions of the whole eval split; reward means under `eval/`."""

  def __init__(self, config, tokenizer, eos, pad):
    self.config, self.tokenizer = config, tokenizer
    self.dataset = data.load_dataset(config.data, "eval", task_options=config.data.task_options)
    self.reward_set = RewardSet.from_config(config.rewards)
    s = config.sampling
    settings = sampling.SamplingSettings(1, s.max_new_tokens, 0.0, 0, 1.0, eos, pad, s.layer_loop,
                                         s.weight_layout)
    self.sampler = sampling.Sampler(settings, config.sampling.prompt_buckets)

  def complete(self, policy, batch: data.RecordBatch):
    """Greedy completions of `batch`'s prompts (texts) and their `Rewards`."""
    tok = data.tokenize_prompts(self.tokenizer, batch.prompts, self.config.data,
                                self.config.sampling.prompt_buckets, indices=batch.indices)
    out = self.sampler.sample_local(policy, tok.token_lists, 0)
    completions = rollout_lib.decode_completions(self.tokenizer, out.tokens, out.lengths)
    return completions, self.reward_set(batch.prompts, completions, **batch.fields())

  def __call__(self, policy) -> dict[str, float]:
    values: dict[str, list] = {}
    valid: list[np.ndarray] = []
    for batch in data.sequential_batches(self.dataset, self.config.train.prompts_per_step,
                                         process_index=jax.process_index(),
                                         process_count=jax.process_count()):
      _, scored = self.complete(policy, batch)
      for name, v in [("total", scored.total), *scored.per_function.items()]:
        values.setdefault(name, []).append(np.where(batch.valid, v, 0.0))
      valid.append(batch.valid)
    # Sums over every process's valid records (padding records count for nothing).
    sums, count = distributed.concat(({k: np.concatenate(v) for k, v in values.items()},
                                      np.concatenate(valid)))
    means = {f"eval/reward/{k}": float(v.sum() / count.sum()) for k, v in sums.items()}
    first = self.reward_set.names[0]
    means["eval/accuracy"] = means[f"eval/reward/{first}"]  # the first reward function
    return means

  @staticmethod
  def table_row(step: int, row: dict[str, float]) -> str:
    text = f"step {step:5d} | held-out accuracy {row['eval/accuracy']:.3f}"
    for key, name in (("reward_mean", "train reward"), ("loss", "loss")):
      if key in row:
        text += f" | {name} {row[key]:.3f}"
    return text


def greedy_samples(config, count: int, model_path: str = "") -> list[dict]:
  """What the evaluator scores, shown: the first `count` held-out records, answered greedily.

  Args:
    config: a full config (its model, data, sampling and rewards sections are read).
    count: how many records, from the start of the eval split.
    model_path: a Hugging Face directory to load instead of `config.model.path`, e.g. a
      finished run's `export/`.

  Returns:
    One dict per record: `prompt`, `completion`, the record's other fields (`answer`, ...),
    `reward` (the weighted total) and `reward/NAME` for each reward function.
  """
  if model_path:
    config = config.copy_and_resolve_references()
    config.model.path = model_path
  validation.validate_config(config)
  mesh, rules = sh.split_meshes(config.mesh)[0], sh.freeze_rules(config.mesh.rules)
  tokenizer, policy = load_tokenizer_and_policy(config, mesh, rules)
  evaluator = Evaluator(config, tokenizer, rollout_lib.eos_ids(tokenizer, policy.config),
                        rollout_lib.pad_id(tokenizer))
  if not 0 < count <= len(evaluator.dataset):
    raise ValueError(f"count={count}: expected 1 to {len(evaluator.dataset)}, the size of the "
                     f"eval split of config.data.source={config.data.source!r}")
  batch = next(data.sequential_batches(evaluator.dataset, count, process_index=jax.process_index(),
                                       process_count=jax.process_count()))
  completions, scored = evaluator.complete(policy, batch)
  fields = batch.fields()
  return [{"prompt": prompt, "completion": completion, **{k: v[i] for k, v in fields.items()},
           "reward": float(scored.total[i]),
           **{f"reward/{name}": float(v[i]) for name, v in scored.per_function.items()}}
          for i, (prompt, completion) in enumerate(zip(batch.prompts, completions))]
