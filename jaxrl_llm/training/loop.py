"""The RL training loop: sample -> reward -> advantages -> update -> log/eval/checkpoint.

`train(config, workdir)` runs every preset in `configs/`. What differs between
algorithms is data: the plan (`plan.make_plan`) decides from `config.algo`'s axes which
models exist and which arrays a step needs, and the objectives read the axes. Nothing
here branches on a name.

Every process runs this same loop (`jaxrl_llm.distributed`): each samples and scores
its own slice of the prompts, the update steps run on global arrays over one mesh,
process 0 alone writes logs, and orbax writes checkpoints from all processes.

Resume: a checkpoint holds the TrainState (parameters, optimizer, RNG key), the data
position and the skip counters; sampling keys are folded from the step, so a run
restarted from step s reproduces an uninterrupted run from s on. SIGTERM and non-finite
updates: see `guards`. Asynchronous rollouts and split placement: see `feed`.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from jaxrl_llm import distributed, models, paths
from jaxrl_llm import config as config_lib
from jaxrl_llm.training import evaluation, feed as feed_lib, flops, guards
from jaxrl_llm.training import metrics as metrics_lib
from jaxrl_llm.training import plan as plan_lib
from jaxrl_llm.training import prepare, resume, rollout_log, setup as setup_lib, trackers


def train(config, workdir: str, devices=None, print_config: bool = False,
          resume_with_changes: bool = False) -> dict[str, float]:
  """Runs (or resumes) the experiment `config` in `workdir`; returns the last metrics.

  Args:
    config: a full config (a preset from `configs/`, `jaxrl_llm.config.preset`).
    workdir: a local directory or a gs:// URL; checkpoints, metrics.jsonl, tb/ and
      export/ go here; a workdir that holds checkpoints is resumed from the latest (and
      the runs of config.logging.trackers that trackers.json names are continued).
    devices: the devices of the mesh (default: all devices of all processes).
    print_config: print the whole config (process 0) once it is validated.
    resume_with_changes: resume a checkpoint of another `config.algo` or `config.model`.

  Raises:
    jaxrl_llm.config.ConfigError: a bad config value or input, or a workdir this config
      cannot resume, before anything is loaded or written.
  """
  # ---------------------------------------------------------------- Plan and set-up
  plan, setup, ckpt, start = _set_up(config, workdir, devices, resume_with_changes)
  _record_config(config, workdir, print_config)
  t, programs, mesh = config.train, setup.programs, setup.models.mesh
  feed = feed_lib.Feed(config, plan, setup, start)
  evaluator = (evaluation.Evaluators(config, setup.tokenizer, setup.models.policy.config,
                                     setup.judge) if t.eval_every > 0 else None)
  guard = guards.NonFiniteGuard(t.max_consecutive_skips, start.skipped_steps,
                                start.consecutive_skips)
  params = trackers.run_params(config, workdir, resume.run_identity(config))
  writer = metrics_lib.MetricsWriter(workdir, config.logging, t.steps, start.step, params)
  rollout_writer = rollout_log.RolloutWriter(
      workdir, config.logging.rollouts_every,
      tuple(s.name for s in plan.sources) if plan.mixed else (), start.step, writer)
  peak = _announce(writer, plan, mesh, t.peak_flops_per_device, start.step, workdir)
  as_policy = lambda st: setup.models.trained_policy(st.policy_params)
  state, row = start.state, {}
  preemption = guards.PreemptionWatch()
  preemption.install()
  try:
    with feed.turn(start.step - 1):  # the programs before the first step
      feed.publish(start.step, state.policy_params)
      if evaluator is not None and start.step == 0:  # the starting point, as step 0
        row = evaluator.report(writer, 0, as_policy(state))
        writer.write(0, row)
    for step in range(start.step, t.steps):
      with feed.turn(step):  # every process issues its programs in one order
        t_step = time.perf_counter()
        # ---------------------------------------------------------------- Sample + reward
        rollout, t_sample, t_reward = feed.get(step, state.policy_params)
        # ---------------------------------------------------------------- Log-probs, advantages
        t0 = time.perf_counter()
        state, arrays, batch, prepare_metrics = _prepare(config, plan, setup, state, rollout)
        t_logprob = time.perf_counter() - t0
        # ---------------------------------------------------------------- Update
        t0 = time.perf_counter()
        state, update_metrics = programs.update(
            state, batch, np.random.default_rng([config.seed, step]), setup.models.base)
        feed.publish(step + 1, state.policy_params)
        guard_row = guard.update(step + 1, update_metrics)  # the rest waits for a logged step
        t_update = time.perf_counter() - t0
        # ---------------------------------------------------------------- Log, eval, checkpoint
        done = step + 1
        times = dict(step=time.perf_counter() - t_step, sample=t_sample, logprob=t_logprob,
                     update=t_update, reward=t_reward)
        evaluate = evaluator is not None and (done % t.eval_every == 0 or done == t.steps)
        if done % t.log_every == 0 or done == t.steps or guard.consecutive:
          row = _step_row(config, plan, setup, rollout, arrays, update_metrics, times, done,
                          peak, guard_row, prepare_metrics, feed.async_metrics(rollout))
          if evaluate:
            row.update(evaluator.report(writer, done, as_policy(state), row))
          writer.write(done, row)
        elif evaluate:
          evaluator.report(writer, done, as_policy(state))
        if rollout_writer.due(done):
          rollout_writer.write(done, rollout, step if rollout.policy_version is None
                               else rollout.policy_version)
        guard.check(done)
        preempted = preemption.requested() and done < t.steps
        if ckpt.due(done, last=done == t.steps) or preempted:
          _save(ckpt, preemption, done, state, wait=preempted,
                meta=_checkpoint_meta(config, plan, setup, done, rollout, guard))
        if preempted:
          raise guards.Preempted(done, preemption.signal_name)
    # ---------------------------------------------------------------- Export
    ckpt.wait()
    _export(as_policy(state), setup.tokenizer, workdir, config.model.path or None)
  finally:
    feed.close()
    preemption.uninstall()
    ckpt.close()
    writer.close()
  return row


def _save(ckpt, preemption, step: int, state, meta, wait: bool) -> None:
  """Checkpoint `step` (and, with `wait`, until it is complete); a second Ctrl-C meanwhile
  raises once it is done (`guards.PreemptionWatch.saving`)."""
  with preemption.saving(step):
    ckpt.save(step, state, meta)
    if wait:
      ckpt.wait()


def _set_up(config, workdir: str, devices, resume_with_changes: bool):
  """(plan, setup, checkpointer, start): the config checked, the plan made, the workdir's
  checkpoints opened (refused before anything loads if this config cannot resume them),
  the models set up and the start restored; the checkpointer is closed on a refusal."""
  config_lib.validate(config, devices, workdir, data=True)
  plan = plan_lib.make_plan(config)
  ckpt, latest = resume.open_checkpoints(workdir, config, plan, resume_with_changes)
  try:
    setup = setup_lib.set_up(config, plan, devices)
    return plan, setup, ckpt, resume.start_point(setup, ckpt, latest, config.seed)
  except config_lib.ConfigError:
    ckpt.close()
    raise


def _prepare(config, plan, setup, state, rollout):
  """(state, arrays, batch, metrics): the rollout's arrays placed on the mesh, then the
  old, reference and teacher log-probs, values and advantages (`programs.prepare`),
  waited for; the state takes the step's new baselines."""
  arrays = prepare.batch_arrays(rollout, plan.rows_per_prompt,
                                plan.algo.overlong.mask_truncated)
  batch, metrics, baselines = setup.programs.prepare(
      prepare.place_batch(arrays, setup.models.mesh, setup.models.rules),
      setup.models.trained_policy(state.policy_params), setup.models.reference,
      _value_model(setup, state), setup.models.teacher, state.baselines)
  jax.block_until_ready(batch)
  return state.replace(baselines=baselines), arrays, batch, metrics


def _checkpoint_meta(config, plan, setup, done: int, rollout, guard) -> dict:
  """What a checkpoint records beside the state: the position, the skip counters, and what
  a resume checks (`resume.check`)."""
  positions = {} if rollout.mixed is None else {"source_positions": rollout.mixed.positions}
  if rollout.in_flight is not None:  # every process's (a collective; all checkpoint together)
    positions["in_flight"] = distributed.gather_strings([rollout.in_flight()])
  return {"step": done, "data_position": rollout.position, **positions, **guard.state(),
          "fingerprint": resume.fingerprint(setup.models.policy.config, plan.value_model,
                                            plan.baselines),
          "run": resume.run_identity(config),
          **({} if setup.base_fingerprint is None else
             {"base_fingerprint": setup.base_fingerprint})}


def _value_model(setup: setup_lib.Setup, state):
  value = setup.models.value
  return None if value is None else value.replace(params=state.value_params)


def _record_config(config, workdir: str, print_config: bool) -> None:
  if jax.process_index() == 0:
    paths.write_atomic(paths.join(workdir, "config.json"), config.to_json_best_effort(indent=2))
    if print_config:
      print(config)
      if config.model.path:
        print(f"(config.model.arch is not read: {config.model.path}/config.json gives the "
              "architecture)")


def _announce(writer, plan, mesh, peak_flops_per_device: float, start: int,
              workdir: str) -> float:
  """Prints the plan, the MFU peak and where the run starts; returns the mesh's peak FLOP/s."""
  peak, origin = flops.peak_flops_per_device(mesh.devices.flatten().tolist(),
                                             peak_flops_per_device)
  writer.print(plan.describe())
  writer.print(f"mfu: model FLOPs against {peak / 1e12:.3g} TFLOP/s per device ({origin})")
  if start:
    writer.print(f"resuming from the checkpoint of step {start} in {workdir}")
  return peak * mesh.size


def _step_row(config, plan, setup, rollout, arrays, update_metrics, times, done: int,
              peak: float, *more: dict) -> dict[str, float]:
  """A logged step's metrics: the updates' means, the rollout's, throughput, MFU, lr and
  `more` (device values fetched here)."""
  update_metrics = jax.device_get(update_metrics)
  row = {k: float(np.mean([m[k] for m in update_metrics])) for k in update_metrics[-1]}
  row.update(rollout.metrics)
  for extra in jax.device_get(more):
    row.update(extra)
  teacher = setup.models.teacher
  row.update(flops.throughput(setup.models.policy.config, plan, rollout, arrays, times,
                              plan.rows_per_prompt, config.sampling.max_new_tokens, peak,
                              teacher_config=None if teacher is None else teacher.config))
  row.update(lr=float(setup.schedule(done * plan.updates_per_step - 1)),
             reward_time_s=times["reward"], data_position=rollout.position)
  return row


def _export(policy: models.Model, tokenizer, workdir: str, base_path: str | None) -> None:
  """The trained policy and its tokenizer as a Hugging Face directory, DIR/export/ (with
  LoRA: the adapters merged in), and with LoRA the adapters alone in PEFT's format,
  DIR/adapter/ (for `peft.PeftModel.from_pretrained` onto `base_path`)."""
  path = paths.join(workdir, "export")
  models.save_pretrained(policy, path)
  if policy.config.has_lora:
    models.save_adapter(policy, paths.join(workdir, "adapter"), base_path)
  if jax.process_index() == 0:
    with paths.local_staging(path) as local:  # transformers writes local files only
      tokenizer.save_pretrained(local)
