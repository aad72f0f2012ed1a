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
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import checkpoints, data, distributed, models, objectives, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.data import char_tokenizer
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.rewards import RewardSet
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


def load_tokenizer_and_policy(config, mesh, rules):
  """The policy (HF directory, or the in-config architecture) and its tokenizer."""
  m = config.model
  if m.path:
    policy = models.from_pretrained(m.path, dtype=m.dtype, param_dtype=m.param_dtype,
                                    remat=m.remat, attention=m.attention, mesh=mesh, rules=rules)
    tokenizer = data.load_tokenizer(m.tokenizer_path or m.path)
  else:
    a = m.arch
    cfg = ModelConfig(
        model_type=a.model_type, vocab_size=a.vocab_size, hidden_size=a.hidden_size,
        intermediate_size=a.intermediate_size, num_layers=a.num_layers, num_heads=a.num_heads,
        num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, rope_theta=a.rope_theta,
        rms_norm_eps=a.rms_norm_eps, tie_word_embeddings=a.tie_word_embeddings,
        max_position_embeddings=a.max_position_embeddings, qkv_bias=a.model_type == "qwen2",
        qk_norm=a.model_type == "qwen3", dtype=m.dtype, param_dtype=m.param_dtype,
        remat=m.remat, attention=m.attention, eos_token_id=char_tokenizer.EOS_ID, pad_token_id=char_tokenizer.PAD_ID,
        bos_token_id=char_tokenizer.BOS_ID)
    policy = models.init(cfg, jax.random.PRNGKey(config.seed), mesh=mesh, rules=rules)
    tokenizer = (data.load_tokenizer(m.tokenizer_path) if m.tokenizer_path
                 else char_tokenizer.build_char_tokenizer(vocab_size=a.vocab_size))
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


def _batch_arrays(r: rollout_lib.Rollout, G: int, mask_truncated: bool) -> dict[str, np.ndarray]:
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
      "rewards": r.rewards.reshape(-1, G).astype(np.float32),
  }
  if r.logprobs is not None:
    out["sampler_logp"] = r.logprobs.astype(np.float32)
  return out


def _place_batch(arrays: dict[str, np.ndarray], mesh, rules) -> dict[str, jax.Array]:
  """Each process's rows -> global arrays sharded over the batch axis."""
  return {k: sh.put_process_rows(v, (sh.BATCH,) + (None,) * (v.ndim - 1), mesh, rules)
          for k, v in arrays.items()}


def _needs_old_logp(algo) -> bool:
  """Whether a batch without sampler log-probs needs them recomputed.

  Only an importance ratio, the KL-in-reward term, or an explicit
  `algo.old_logp='recompute'` read them. Otherwise (SFT: targets from the dataset, ratio
  `none`) the update takes `old_logp` = its own log-probs, stop-gradient, which is what
  a recomputation gives for the first update and saves a forward pass per step.
  """
  return (algo.loss.ratio != "none" or algo.old_logp == "recompute"
          or (algo.kl.coef > 0 and algo.kl.placement == "reward"))


def _prepare(batch, policy, reference, value, *, algo, temperature, chunk_size):
  """Old/reference log-probs, values and advantages of a rollout batch (one program)."""
  out = dict(batch)
  mask = batch["loss_mask"]
  if "sampler_logp" in batch and algo.old_logp == "sampler":
    old_logp = jnp.where(mask > 0, batch["sampler_logp"], 0.0)
  elif _needs_old_logp(algo):
    old_logp, _ = steps.completion_logp(policy, batch, temperature=temperature, chunk_size=chunk_size)
    old_logp = jnp.where(mask > 0, old_logp, 0.0)
  else:  # SFT: no behaviour log-probs and nothing reads them; the step uses its own
    old_logp = None
  ref_logp = values = None
  if reference is not None:
    ref_logp, _ = steps.completion_logp(reference, batch, temperature=temperature, chunk_size=chunk_size)
    ref_logp = jnp.where(mask > 0, ref_logp, 0.0)
  if value is not None:
    values = steps.completion_values(value, batch)
  adv, returns = objectives.token_advantages(batch["rewards"], mask, algo, logp_BT=old_logp,
                                             ref_logp_BT=ref_logp, values_BT=values)
  if algo.tis_cap > 0 and "sampler_logp" in batch and algo.old_logp == "recompute":
    adv = adv * objectives.truncated_importance_weight(old_logp, batch["sampler_logp"], algo.tis_cap)
  out["advantages"] = adv
  if old_logp is not None:
    out["old_logp"] = old_logp
  if ref_logp is not None and algo.kl.placement == "loss":
    out["ref_logp"] = ref_logp
  if values is not None:
    out.update(old_values=values, returns=returns)
  out.pop("rewards")
  out.pop("sampler_logp", None)
  return out


# --- the loop -------------------------------------------------------------------------------------
def train(config, workdir: str, devices=None) -> dict[str, float]:
  """Runs (or resumes) the experiment `config` in `workdir`; returns the last metrics.

  Args:
    config: a full config (see `configs/`).
    workdir: checkpoints, metrics.jsonl, tb/ and export/ go here; a workdir that holds
      checkpoints is resumed from the latest.
    devices: the devices of the mesh (default: all devices of all processes).
  """
  # ---------------------------------------------------------------- Set-up
  validation.validate_config(config, devices)
  validation.check_writable(workdir)
  algo, t, s = config.algo, config.train, config.sampling
  G, P, N = s.num_samples, t.prompts_per_step, s.max_new_tokens
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))
  mesh = sh.make_mesh(config.mesh, devices)
  rules = sh.freeze_rules(config.mesh.rules)
  tokenizer, policy = load_tokenizer_and_policy(config, mesh, rules)
  eos, pad = rollout_lib.eos_ids(tokenizer, policy.config), rollout_lib.pad_id(tokenizer)
  reference = (policy.replace(params=jax.tree.map(jnp.copy, policy.params))
               if uses_reference(algo) else None)
  value = models.value_model(policy) if uses_value_model(algo) else None

  updates_per_step = algo.num_iterations * algo.num_minibatches
  # One schedule: the optimizer follows it and the `lr` metric reads it.
  schedule = state_lib.make_schedule(config.optimizer, t.steps * updates_per_step)
  optimizer = state_lib.make_optimizer(config.optimizer, schedule)
  state = state_lib.init_state(policy.params, None if value is None else value.params,
                               optimizer, optimizer, config.seed)
  # Parameters and optimizer moments are already sharded; counters and the key replicate.
  state = jax.device_put(state, jax.tree.map(
      lambda x: x.sharding if isinstance(x.sharding, jax.sharding.NamedSharding)
      else sh.replicated(mesh), state))
  state_shardings = jax.tree.map(lambda x: x.sharding, state)

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
  settings = sampling.SamplingSettings(G, N, s.temperature, s.top_k, s.top_p, eos, pad)
  sampler = sampling.Sampler(settings, s.prompt_buckets)
  if config.data.completions == "sample":
    rollouts = rollout_lib.SampledRollouts(config, tokenizer, batches, sampler,
                                           RewardSet.from_config(config.rewards))
  else:
    rollouts = rollout_lib.DatasetRollouts(config, tokenizer, batches, eos)
  evaluator = (Evaluator(config, tokenizer, eos, pad) if t.eval_every > 0 else None)

  # ---------------------------------------------------------------- Compiled steps
  as_policy = lambda st: policy.replace(params=st.policy_params)
  as_value = lambda st: None if value is None else value.replace(params=st.value_params)
  prepare = jax.jit(functools.partial(_prepare, algo=algo, temperature=s.temperature,
                                      chunk_size=t.logprob_chunk_size))
  minibatch_rows = P * G // algo.num_minibatches
  num_micro = minibatch_rows // min(t.micro_batch_size, minibatch_rows)
  policy_update = jax.jit(
      functools.partial(steps.policy_step, model_static=policy.replace(params=None), algo=algo,
                        optimizer=optimizer, temperature=s.temperature,
                        chunk_size=t.logprob_chunk_size, num_micro=num_micro),
      donate_argnums=(0,), out_shardings=(state_shardings, None))
  value_update = None if value is None else jax.jit(
      functools.partial(steps.value_step, model_static=value.replace(params=None), algo=algo,
                        optimizer=optimizer, num_micro=num_micro),
      donate_argnums=(0,), out_shardings=(state_shardings, None))
  take_rows = jax.jit(lambda batch, idx: jax.tree.map(lambda x: x[idx], batch))
  next_step = jax.jit(steps.next_step, donate_argnums=(0,), out_shardings=state_shardings)
  total = jax.jit(jnp.sum)

  peak = t.peak_flops_per_device or metrics_lib.measure_peak_flops()
  guard = guards.NonFiniteGuard(t.max_consecutive_skips, skips.get("skipped_steps", 0),
                                skips.get("consecutive_skips", 0))
  writer = metrics_lib.MetricsWriter(workdir, config.logging, t.steps, start)
  preemption = guards.PreemptionWatch()
  preemption.install()
  row: dict[str, float] = {}
  try:
    if evaluator is not None and start == 0:  # the starting point, as step 0
      row = evaluator(as_policy(state))
      writer.print(evaluator.table_row(0, row))
      writer.write(0, row)
    for step in range(start, t.steps):
      t_step = time.perf_counter()
      key = jax.random.fold_in(jax.random.PRNGKey(config.seed), step)
      # ---------------------------------------------------------------- Sample + reward
      t0 = time.perf_counter()
      rollout = rollouts(as_policy(state), key)
      t_reward = rollout.metrics.pop("reward_time_s", 0.0)
      t_sample = time.perf_counter() - t0 - t_reward
      # ---------------------------------------------------------------- Log-probs, advantages
      t0 = time.perf_counter()
      batch = _place_batch(_batch_arrays(rollout, G, algo.overlong.mask_truncated), mesh, rules)
      batch = prepare(batch, as_policy(state), reference, as_value(state))
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
          minibatch = take_rows(batch, idx) if algo.num_minibatches > 1 else batch
          state, pm = policy_update(state, minibatch)
          if value_update is not None:
            state, vm = value_update(state, minibatch)
            pm = {**pm, **vm}
          step_metrics.append(pm)
      state = next_step(state)
      step_metrics = jax.device_get(step_metrics)
      t_update = time.perf_counter() - t0
      # ---------------------------------------------------------------- Log, eval, checkpoint
      done = step + 1
      dt = time.perf_counter() - t_step
      row = {k: float(np.mean([m[k] for m in step_metrics])) for k in step_metrics[-1]}
      row.update(rollout.metrics)
      row.update(guard.update(done, step_metrics))
      gen_tokens = float(distributed.concat(rollout.lengths).sum())
      train_tokens = float(total(batch["loss_mask"]))
      S0 = batch["tokens"].shape[1] - N
      context = S0 + N / 2
      flops = metrics_lib.forward_flops(policy.config, gen_tokens, context)  # sampling
      flops += metrics_lib.forward_flops(policy.config, P * G * (S0 + N),
                                         context) * (3 * updates_per_step + (reference is not None)
                                                     + (algo.old_logp == "recompute")
                                                     + 4 * (value is not None))
      row.update(
          lr=float(schedule(done * updates_per_step - 1)), step_time_s=dt,
          sample_time_s=t_sample, logprob_time_s=t_logprob, update_time_s=t_update,
          reward_time_s=t_reward, sample_tokens_per_s=gen_tokens / max(t_sample, 1e-9),
          train_tokens_per_s=train_tokens * updates_per_step / max(t_update, 1e-9),
          mfu=flops / dt / (peak * jax.device_count()), data_position=rollout.position)
      if evaluator is not None and (done % t.eval_every == 0 or done == t.steps):
        row.update(evaluator(as_policy(state)))
        writer.print(evaluator.table_row(done, row))
      if done % t.log_every == 0 or done == t.steps or guard.consecutive:
        writer.write(done, row)
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
    export = os.path.join(workdir, "export")
    models.save_pretrained(as_policy(state), export)
    if jax.process_index() == 0:
      tokenizer.save_pretrained(export)
  finally:
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
    settings = sampling.SamplingSettings(1, config.sampling.max_new_tokens, 0.0, 0, 1.0, eos, pad)
    self.sampler = sampling.Sampler(settings, config.sampling.prompt_buckets)

  def __call__(self, policy) -> dict[str, float]:
    values: dict[str, list] = {}
    valid: list[np.ndarray] = []
    for batch in data.sequential_batches(self.dataset, self.config.train.prompts_per_step,
                                         process_index=jax.process_index(),
                                         process_count=jax.process_count()):
      tok = data.tokenize_prompts(self.tokenizer, batch.prompts, self.config.data,
                                  self.config.sampling.prompt_buckets, indices=batch.indices)
      out = self.sampler.sample_local(policy, tok.token_lists, 0)
      completions = rollout_lib.decode_completions(self.tokenizer, out.tokens, out.lengths)
      scored = self.reward_set(batch.prompts, completions, **batch.fields())
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
