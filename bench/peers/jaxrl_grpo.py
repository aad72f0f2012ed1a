"""tiny-grpo-cpu through jaxrl_llm's public trainer: the project's row of the peer table.

Run with the checkout's environment (`make install`), from the checkout:

  .venv/bin/python bench/peers/jaxrl_grpo.py --round 1
  XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
    .venv/bin/python bench/peers/jaxrl_grpo.py --round 1 --bench jaxrl_grpo_2dev

The second form gives XLA one CPU device per core, so the sampler and the update shard
their rows over a 2-device `data` axis, as they would over the chips of a TPU slice.

What runs is what a user runs: the `grpo` preset (`jaxrl_llm.config.preset("grpo")`:
group-normalised advantages, token-ratio clip 0.2, k3 KL 0.04 in the loss against the
frozen initial policy, sequence-mean of token means), with the workload's model, prompts
and reward filled in through config fields, then `jaxrl_llm.training.train`. The
prompts go in as a JSONL file and the reward as a Python file (`frac_a` from
workload.py), both in a temporary directory, exactly as a user's own would.

Timing comes from the trainer's own per-step log, WORKDIR/metrics.jsonl: `step_time_s`
(the whole step), `sample_time_s` (generation; the reward's time is logged apart),
`logprob_time_s` (reference log-probs and advantages, `programs.prepare`) and
`update_time_s` (forward, backward, AdamW). Each phase ends in a device sync, so the
split adds up to the step. Medians are over the steps after the warm-up ones.

The sampler ends a row at the tokenizer's EOS (id 2); a random model draws it with
probability about 1/512 per token, so some completions are shorter than 64 tokens
(about 60 on average). The batch keeps decoding until every row has finished (in
practice all 64 steps) and the update's shapes are padded to 64, so the work is the
workload's; the mean length is recorded (`mean_completion_tokens`).

`--set FIELD=VALUE` changes any further config field for an experiment (the value is
read as a Python literal), e.g. `--set model.remat=none --set algo.max_async_level=1`;
the result records them, and a table row with overrides is not the baseline.
"""
from __future__ import annotations

import ast
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # this checkout's jaxrl_llm first

import workload as W  # noqa: E402

REWARD_FILE = '''"""The tiny-grpo-cpu reward (workload.frac_a) in jaxrl_llm's reward signature."""
import sys
sys.path.insert(0, {here!r})
import workload


def frac_a(prompts, completions, **fields):
  return [workload.frac_a(c) for c in completions]
'''


def make_config(tmp: str, overrides: list[str]):
  """The grpo preset with the workload's model, data, reward, sampling and optimizer."""
  from jaxrl_llm import config as config_lib

  c = config_lib.preset("grpo")
  m, a = W.MODEL, c.model.arch
  a.model_type = "llama"
  a.vocab_size, a.hidden_size, a.intermediate_size = (
      m["vocab_size"], m["hidden_size"], m["intermediate_size"])
  a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim = (
      m["num_hidden_layers"], m["num_attention_heads"], m["num_key_value_heads"], m["head_dim"])
  a.rope_theta, a.rms_norm_eps = m["rope_theta"], m["rms_norm_eps"]
  a.max_position_embeddings, a.tie_word_embeddings = (
      m["max_position_embeddings"], m["tie_word_embeddings"])
  c.model.dtype = c.model.param_dtype = "float32"
  c.model.tokenizer_path = os.path.join(tmp, "tokenizer")
  W.build_tokenizer(c.model.tokenizer_path)

  for split in ("train", "eval"):
    with open(os.path.join(tmp, f"{split}.jsonl"), "w") as f:
      for prompt in W.prompts():
        f.write(json.dumps({"prompt": prompt}) + "\n")
  c.data.source = "jsonl:" + os.path.join(tmp, "{split}.jsonl")
  with open(os.path.join(tmp, "reward.py"), "w") as f:
    f.write(REWARD_FILE.format(here=HERE))
  c.rewards.functions = (os.path.join(tmp, "reward.py") + ":frac_a",)
  c.rewards.weights = (1.0,)

  s = c.sampling
  s.num_samples, s.max_new_tokens, s.temperature = W.GROUP, W.NEW_TOKENS, W.TEMPERATURE
  s.top_k, s.top_p = 0, 1.0
  s.max_prompt_len, s.prompt_buckets = W.PROMPT_LEN, (W.PROMPT_LEN,)

  c.algo.kl.coef, c.algo.kl.estimator, c.algo.kl.placement = W.BETA, "k3", "loss"
  c.algo.loss.clip_low = c.algo.loss.clip_high = W.CLIP_EPS
  c.algo.num_iterations, c.algo.num_minibatches = 1, 1  # one optimizer step per batch

  o = c.optimizer
  o.lr, o.schedule, o.warmup_steps, o.weight_decay = W.LR, "constant", 0, 0.0
  o.grad_clip_norm = W.GRAD_CLIP

  t = c.train
  t.steps, t.prompts_per_step = W.TOTAL_STEPS, W.NUM_PROMPTS
  t.micro_batch_size = W.NUM_PROMPTS * W.GROUP  # all 64 completions in one pass
  t.eval_every, t.log_every = 0, 1
  c.checkpoint.every = 0
  c.logging.trackers = ("jsonl",)
  c.seed = W.SEED

  for item in overrides:
    key, value = item.split("=", 1)
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass  # a bare string
    config_lib.set_fields(c, {key.strip(): value})
  return c


def main():
  args = W.runner_args("jaxrl_grpo", __doc__, lambda p: p.add_argument(
      "--set", action="append", default=[], metavar="FIELD=VALUE",
      help="a further config field (not part of the baseline)"))
  recorder = W.Recorder(args.bench, args.round, args.results)
  import jax
  import jaxrl_llm
  from jaxrl_llm import training

  tmp = tempfile.mkdtemp(prefix="jaxrl_grpo_")
  config = make_config(tmp, args.set)
  workdir = os.path.join(tmp, "workdir")
  t0 = time.perf_counter()
  training.train(config, workdir)
  train_s = time.perf_counter() - t0

  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [r for r in map(json.loads, f) if "step_time_s" in r]
  assert len(rows) == W.TOTAL_STEPS, (len(rows), W.TOTAL_STEPS)
  measured = rows[W.WARMUP_STEPS:]
  median = lambda key: statistics.median(r[key] for r in measured)
  lengths = [r["response_length_mean"] for r in measured if "response_length_mean" in r]
  try:
    from importlib.metadata import version
    jaxrl_version = version("jaxrl_llm")
  except Exception:  # pylint: disable=broad-except
    jaxrl_version = getattr(jaxrl_llm, "__version__", "?")
  recorder.save(dict(
      stack="jaxrl_llm",
      versions=dict(jaxrl_llm=jaxrl_version, jax=jax.__version__,
                    commit=_git_commit(os.path.dirname(os.path.dirname(HERE)))),
      devices=jax.device_count(),
      xla_flags=os.environ.get("XLA_FLAGS", ""),
      overrides=args.set,
      remat=config.model.remat,
      steps=W.TOTAL_STEPS, warmup=W.WARMUP_STEPS,
      step_s=W.summary(r["step_time_s"] for r in measured),
      first_step_s=rows[0]["step_time_s"],
      sample_s=median("sample_time_s"),
      ref_logprob_s=median("logprob_time_s"),
      update_s=median("update_time_s"),
      update_is_remainder=False,
      reward_s=median("reward_time_s") if "reward_time_s" in measured[0] else None,
      sample_tokens_per_s=W.NUM_PROMPTS * W.GROUP * W.NEW_TOKENS / median("sample_time_s"),
      mean_completion_tokens=statistics.mean(lengths) if lengths else None,
      losses=[r.get("loss") for r in rows],
      last_metrics=rows[-1],
      train_s=train_s,
      all_steps_s=[r["step_time_s"] for r in rows],
  ))


def _git_commit(root: str) -> str:
  """The checkout's commit (with '+dirty' when it has changes), or '' outside git."""
  import subprocess
  try:
    head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                           check=True, capture_output=True, text=True).stdout.strip()
    return head + ("+dirty" if dirty else "")
  except (OSError, subprocess.CalledProcessError):
    return ""


if __name__ == "__main__":
  main()
