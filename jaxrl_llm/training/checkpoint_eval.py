"""A saved policy's held-out metrics, per source: what `launch.evaluate` prints and writes.

For every source of the config (`sources.run_sources`: each of a mixed run's), over its
whole split: greedy pass@1 (temperature 0, as the trainer's `Evaluator`), K samples per
record at the config's sampling temperature, top-k and top-p (`sampled_eval`; K episodes
per record for a multi-turn source) with pass@k for k = 1, 2, 4, ..., K (or
`config.eval.pass_k`; `pass_at_k`), maj@K by the answers of `config.eval.answer_extractor`
(`answers`), and the mean reward. A sample is correct when its reward total reaches
`config.eval.correct_at`.

Every process samples its share of each batch on the config's mesh (as the trainer
does); the records are then gathered and process 0 writes OUTPUT/eval.jsonl (one row per
record: its source, index, prompt and fields, the greedy completion and reward, and the K
samples with their rewards, correctness and answers) and OUTPUT/summary.json (per source:
`pass@1_greedy`, `pass@k` for each k, `maj@K`, `reward_mean`, `reward_mean_greedy`,
`records`).
"""
from __future__ import annotations

import json

import jax
import numpy as np

from jaxrl_llm import config as config_lib
from jaxrl_llm import data, distributed, paths, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.config.errors import ConfigError
from jaxrl_llm.training import answers, evaluation, pass_at_k, saved_policy
from jaxrl_llm.training import setup as setup_lib
from jaxrl_llm.training.rollouts import episodes
from jaxrl_llm.training.sampled_eval import SampledEval


def evaluate(config, model: str, samples: int | None = None, split: str = "eval",
             output: str | None = None, out=print) -> dict:
  """Evaluates the policy `model` names on `config`'s sources; returns the summary.

  Args:
    config: a full config (its sources, sampling, rewards, `eval` and mesh are read; its
      model is replaced by `model`'s: `saved_policy.with_model`).
    model: a Hugging Face directory, or a training workdir (`WORKDIR[:STEP]`, default its
      latest checkpoint): `saved_policy`.
    samples: K, the samples per record (default `config.eval.num_samples`, else
      `config.sampling.num_samples`).
    split: the split of every source ('eval', 'train', ...).
    output: where eval.jsonl and summary.json go (default WORKDIR/eval_STEP for a workdir;
      required for a Hugging Face directory).
    out: prints the table (process 0).

  Raises:
    ConfigError: a bad config, model, split, sample count or output, before the model loads.
  """
  spec = saved_policy.parse_model(model)
  step = saved_policy.pick_step(spec)
  config = saved_policy.with_model(config, spec, step)
  config_lib.validate(config)
  K = samples if samples is not None else (config.eval.num_samples or
                                           config.sampling.num_samples)
  if isinstance(K, bool) or not isinstance(K, int) or K < 1:
    raise ConfigError(f"--samples={K}: expected a positive number of samples per record")
  try:
    ks = pass_at_k.resolve_ks(config.eval.pass_k, K)
  except ValueError as e:
    raise ConfigError(f"{e} (--samples={K})") from e
  if not output and step is None:
    raise ConfigError(f"--output is required with --model={model!r} (a Hugging Face "
                      "directory): expected a directory for eval.jsonl and summary.json")
  datasets = _datasets(config, split)
  output = output or paths.join(spec.path, f"eval_{step}")
  config_lib.check_writable(output)
  mesh, rules = sh.split_meshes(config.mesh)[0], sh.freeze_rules(config.mesh.rules)
  tokenizer, policy = saved_policy.load_policy(config, spec, step, mesh, rules)
  judge = setup_lib.load_judge(config)  # a reward function of the sources, if any
  rows = []
  for source, dataset in zip(sources_lib.run_sources(config), datasets):
    rows += _source_rows(config, tokenizer, policy, source, dataset, K, judge)
  summary = {"model": spec.path, "step": step, "split": split, "num_samples": K,
             "sources": {name: _summary([r for r in rows if r["source"] == name], ks)
                         for name in dict.fromkeys(r["source"] for r in rows)}}
  if jax.process_index() == 0:
    paths.write_atomic(paths.join(output, "eval.jsonl"),
                       "".join(json.dumps(r, default=str) + "\n" for r in rows))
    paths.write_atomic(paths.join(output, "summary.json"), json.dumps(summary, indent=2) + "\n")
    out(table(summary))
    out(f"wrote {paths.join(output, 'eval.jsonl')} and summary.json")
  return summary


def _datasets(config, split: str) -> list:
  """Every source's `split`, loaded before the model (a bad split is a `ConfigError`)."""
  out = []
  for source in sources_lib.run_sources(config):
    data_cfg = sources_lib.data_config(config, source)
    try:
      out.append(data.load_dataset(data_cfg, split, task_options=data_cfg.task_options))
    except (ValueError, OSError) as e:
      raise ConfigError(f"--split={split!r}: {' '.join(str(e).split())}") from e
  return out


def source_name(source) -> str:
  """A source's name in the outputs: its `config.sources` key, "default" in a one-source run
  (as in rollouts.jsonl)."""
  return source.name or "default"


def _source_rows(config, tokenizer, policy, source, dataset, K: int, judge) -> list[dict]:
  """Every record of `dataset` (every process's), answered greedily and sampled K times."""
  settings = sampling.settings.from_config(config.sampling,
                                           sampling.eos_ids(tokenizer, policy.config),
                                           sampling.pad_id(tokenizer), greedy=True)
  prompt_format = data.PromptFormat.from_config(config)
  greedy = evaluation.Evaluator(source, dataset, settings, prompt_format, tokenizer,
                                config.train.prompts_per_step, judge=judge)
  sampled = SampledEval.for_source(config, tokenizer, policy.config, source, K, judge)
  extractor = answers.extractor_for(config.eval.answer_extractor, source.rewards.functions)
  # Episodes run on one copy on this process's first device, made once.
  model = policy if not source.multi_turn else episodes.local_model(policy)
  lines = []
  try:
    for batch in data.sequential_batches(dataset, config.train.prompts_per_step,
                                         process_index=jax.process_index(),
                                         process_count=jax.process_count()):
      completions, scored = greedy.complete(model, batch)
      drawn = sampled.sample(model, batch)
      for p, record in enumerate(batch.records):
        samples = drawn.completions[p]
        lines.append(json.dumps({
            "valid": bool(batch.valid[p]), "source": source_name(source),
            "index": int(batch.indices[p]), "prompt": record["prompt"],
            "fields": {k: v for k, v in record.items() if k != "prompt"},
            "greedy_completion": completions[p], "greedy_reward": _rounded(scored.total[p]),
            "greedy_correct": bool(scored.total[p] >= config.eval.correct_at),
            "samples": samples, "rewards": [_rounded(r) for r in drawn.totals[p]],
            "correct": [bool(c) for c in drawn.correct[p]],
            "answers": [answers.extract(extractor, s) for s in samples]}, default=str))
  finally:
    sampled.close()
    if greedy.player is not None:
      greedy.player.close()
  # Every process's rows (the same count each: padding included, then dropped).
  rows = [json.loads(line) for line in distributed.gather_strings(lines)]
  return [{k: v for k, v in r.items() if k != "valid"} for r in rows if r["valid"]]


def _rounded(reward) -> float:
  """A float32 reward as JSON shows it: 0.1, not 0.10000000149011612."""
  return round(float(reward), 6)


def _summary(rows: list[dict], ks) -> dict[str, float]:
  """One source's metrics from its rows."""
  sampled = pass_at_k.summarize(np.asarray([r["correct"] for r in rows]),
                                [r["answers"] for r in rows],
                                np.asarray([r["rewards"] for r in rows]), ks)
  return {"records": len(rows),
          "pass@1_greedy": float(np.mean([r["greedy_correct"] for r in rows])),
          **sampled, "reward_mean_greedy": float(np.mean([r["greedy_reward"] for r in rows]))}


def table(summary: dict) -> str:
  """The summary as a text table: one line per source."""
  sources = summary["sources"]
  first = next(iter(sources.values()))
  columns = [c for c in first if c != "records"]
  width = max([len("source")] + [len(name) for name in sources])
  header = f"{'source':<{width}}  {'records':>7}" + "".join(f"  {c:>{max(len(c), 6)}}"
                                                           for c in columns)
  lines = [header]
  for name, metrics in sources.items():
    lines.append(f"{name:<{width}}  {metrics['records']:>7d}" +
                 "".join(f"  {metrics[c]:>{max(len(c), 6)}.3f}" for c in columns))
  step = "" if summary["step"] is None else f" step {summary['step']}"
  return (f"{summary['model']}{step}, split {summary['split']!r}, "
          f"K = {summary['num_samples']} samples per record\n" + "\n".join(lines))
