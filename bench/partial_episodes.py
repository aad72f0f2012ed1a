"""Partial rollouts of episodes: the time to collect a step's batch of multi-turn episodes
with `config.rollouts.partial` (`rollouts.partial_episodes`: the first P groups to end, the
others carried into the next step) against without (`rollouts.multi_turn`: every episode of
the step's P groups played to its end, each admitted at its own pace), in one process, same
model, same records, same environment.

Environment: bench/agents_async.py's `LatencyEnv` (3 to 5 model turns per record, each reply
after a lognormal sleep of median 0.2 s and p99 3 s, seeded by the record and the turn).
Model: the shipped `jaxrl_llm/assets/calculator_sft` on one XLA CPU device at temperature
1.0, at most 96 new tokens a turn, 600 an episode; P = `--prompts` problems of the calculator
task x G = 4 episodes a step (configs/grpo_calculator.py's shape), scored by its rewards.
No update runs between steps (the same weights are published as each new version), so the
figure is the collection alone: what a step of an asynchronous run at max_async_level 1
waits for. `--warmup` steps compile the programs (with partial rollouts the episodes
re-prefilled after a publish bring prompt shapes of their own); `--steps` are timed.

  .venv/bin/python bench/partial_episodes.py              # about 4 minutes

Printed: median s per step of each, and partial over whole-batch; the last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

AGENTS_BENCH = os.path.join(REPO, "bench", "agents_async.py")


def make_source(partial: bool, prompts: int, latency: float):
  """The rollout source of configs/grpo_calculator.py with the latency environment."""
  import jax
  import numpy as np
  from jaxrl_llm import assets, data, models, sampling, tasks
  from jaxrl_llm import config as config_lib
  from jaxrl_llm.training import plan as plan_lib
  from jaxrl_llm.training import rollouts
  config = config_lib.presets.load(os.path.join(REPO, "configs/grpo_calculator.py"))
  config.unlock()
  config.data.env = f"{AGENTS_BENCH}:LatencyEnv"
  config.data.env_args = {"median_s": latency}
  config.data.env_workers = 4 * prompts * config.sampling.num_samples
  config.data.max_turns = 5
  config.data.max_episode_tokens = 600
  config.sampling.max_new_tokens = 96
  config.sampling.temperature = 1.0
  config.sampling.engine = "continuous"
  config.train.prompts_per_step = prompts
  config.algo.max_async_level = 1
  config.rollouts.partial = partial
  path = assets.path("calculator_sft")
  tokenizer = data.load_tokenizer(path)
  policy = models.from_pretrained(path)
  settings = sampling.settings.from_config(config.sampling,
                                           sampling.eos_ids(tokenizer, policy.config),
                                           sampling.pad_id(tokenizer))
  records = tasks.load_split("calculator", "train")

  def batches():
    for q in range(10**6):
      chosen = [dict(records[(q * prompts + p) % len(records)]) for p in range(prompts)]
      yield data.RecordBatch(q, np.arange(q * prompts, (q + 1) * prompts), chosen,
                             np.ones(prompts, bool), None, None)
  source = rollouts.for_plan(plan_lib.make_plan(config), settings,
                             data.PromptFormat.from_config(config), tokenizer, batches())
  return source, jax.device_put(policy.params, jax.local_devices()[0]), policy.config


def collect(source, partial: bool, model, step: int):
  import jax
  key = jax.random.PRNGKey(step)
  if partial:
    return source.finish((step, step, key, model))
  return source.finish(source.start(model, key))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--prompts", type=int, default=16)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--latency", type=float, default=0.2, help="median seconds")
  args = parser.parse_args()
  from jaxrl_llm import models

  results = {}
  for partial in (False, True):
    name = "partial" if partial else "whole batch"
    source, params, model_config = make_source(partial, args.prompts, args.latency)
    model = models.Model(params, model_config)
    times, lags = [], []
    try:
      for step in range(args.warmup):
        collect(source, partial, model, step)
      for step in range(args.warmup, args.warmup + args.steps):
        t = time.perf_counter()
        rollout = collect(source, partial, model, step)
        times.append(time.perf_counter() - t)
        lags.append(rollout.metrics.get("partial/tokens_lag_1", 0.0))
        print(f"  {name} step {step}: {times[-1]:.2f} s", flush=True)
    finally:
      source.close()
    results[name] = dict(step_s=round(statistics.median(times), 3), times=times,
                         tokens_lag_1=round(statistics.mean(lags), 3))
  ratio = results["whole batch"]["step_s"] / results["partial"]["step_s"]
  print(f"\n| collection ({args.prompts} problems x 4 episodes a step, latency median "
        f"{args.latency} s) | s/step | tokens one version old |")
  print("|---|---|---|")
  for name, row in results.items():
    print(f"| {name} | {row['step_s']:.2f} | {row['tokens_lag_1']:.2f} |")
  print(f"partial / whole batch: {ratio:.2f}x")
  print(json.dumps(dict(results=results, ratio=ratio, latency=args.latency,
                        prompts=args.prompts)))


if __name__ == "__main__":
  main()
