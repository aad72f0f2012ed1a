"""Synchronous vs asynchronous rollouts: step times of tiny-grpo-cpu on the same devices.

  XLA_FLAGS=--xla_force_host_platform_device_count=2 .venv/bin/python bench/async.py
  .venv/bin/python bench/async.py --devices=8 --rollout_devices=2 --steps=20

Runs the workload of `bench/train_step.py` (tiny-grpo-cpu by default) through `train()`
three times on the first `--devices` devices:
  sync:        max_async_level 0, one mesh over every device (today's loop);
  async:       max_async_level 1, rollout_devices N (the sampler's mesh), the trainer the rest;
  async_shared: max_async_level 1 on the shared mesh (the overlap of reward scoring only,
               and of whatever the devices run concurrently);
  sync_trainer: max_async_level 0 on the trainer's devices alone (the last N - n): what
               'async' would cost without any overlap (not in the default modes).
`--old_logp=recompute` makes the asynchronous runs recompute the old log-probs (the
trust region then centres on the current policy; one more forward per step).
`--modes=tail,tail_partial` runs a long-tailed workload instead (`long_tail_workload`: a
random model whose next token is uniform over its 128 ids, so completions end at the EOS
after a geometric number of tokens, mean 128, cut at 512; 16 prompts x 8), both at
max_async_level 1: 'tail' waits for each step's longest completion, 'tail_partial' takes
the first 16 groups to finish (`config.rollouts.partial`); 'tail_partial2' is the latter
at max_async_level 2 (the collection also overlaps the update).
Printed per mode: the median step time after `--warmup` steps (`step_time_s`: everything
the trainer's thread does in a step, including waiting for the rollout), the median time
the trainer waited for a rollout, and the wall time of the measured steps. The last line
is JSON, after 'RESULT '.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

import train_step  # noqa: E402  (its flags: --shape, --warmup, --steps)

_DEVICES = flags.DEFINE_integer("devices", 2, "devices the runs use (the first N)")
_ROLLOUT_DEVICES = flags.DEFINE_integer("rollout_devices", 1, "the sampler's share in 'async'")
_OLD_LOGP = flags.DEFINE_enum("old_logp", "auto", ["auto", "sampler", "recompute"],
                               "config.algo.old_logp of the asynchronous runs")
_MODES = flags.DEFINE_list("modes", ["sync", "async", "async_shared"], "which runs, in order")


def long_tail_workload(tmp: str, shape: str = "narrow"):
  """A Llama of 2 layers (hidden 64; with shape 'qwen3_0_6b' a Qwen3-0.6B body in bf16)
  whose output layer is zero: every next token is uniform over the 128 ids of the demo's
  character tokenizer, the EOS among them, so completion lengths are geometric (mean 128),
  cut at 512 new tokens; a tiny learning rate keeps it so. No reference model and no
  remat: the update as light as it gets."""
  import shutil
  import numpy as np
  import torch
  import transformers
  from configs import grpo
  src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "jaxrl_llm", "assets", "arithmetic_sft")
  path = os.path.join(tmp, "uniform_model")
  os.makedirs(path, exist_ok=True)
  for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(src, name), path)
  body = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16)
  if shape == "qwen3_0_6b":
    body = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=8, head_dim=128)
  hf_config = (transformers.Qwen3Config if shape == "qwen3_0_6b" else transformers.LlamaConfig)(
      vocab_size=128, max_position_embeddings=1024, tie_word_embeddings=False, bos_token_id=1,
      eos_token_id=2, pad_token_id=0, **body)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(hf_config)
  with torch.no_grad():
    model.lm_head.weight.zero_()
  model.save_pretrained(path)
  c = train_step.workload(tmp, "narrow")  # its reward and optimizer
  rng = np.random.RandomState(0)
  for split in ("train", "eval"):  # 256 prompts of 32 letters
    with open(os.path.join(tmp, f"{split}.jsonl"), "w") as f:
      for _ in range(256):
        f.write(json.dumps({"prompt": "".join(rng.choice(list("abcdefghij"), 32))}) + "\n")
  c.model.path = path
  c.sampling.max_new_tokens, c.sampling.num_samples = 512, 8
  c.sampling.max_prompt_len, c.sampling.prompt_buckets = 64, (32, 64)
  c.train.prompts_per_step, c.train.micro_batch_size = 16, 64
  c.optimizer.lr, c.algo.kl.coef, c.model.remat = 1e-7, 0.0, "none"
  if shape == "qwen3_0_6b":
    c.model.dtype, c.sampling.page_size = "bfloat16", 32
    c.train.prompts_per_step, c.train.micro_batch_size = 32, 32
  return c


def run(mode: str, tmp: str) -> dict:
  import jax
  from jaxrl_llm import training
  tail = mode.startswith("tail")
  shape = train_step._SHAPE.value
  config = long_tail_workload(tmp, shape) if tail else train_step.workload(tmp, shape)
  warmup, steps = train_step._WARMUP.value, train_step._STEPS.value
  config.train.steps, config.train.log_every = warmup + steps, 1
  config.checkpoint.every, config.train.eval_every = 0, 0
  config.algo.max_async_level = 0 if mode.startswith("sync") else 2 if mode.endswith("2") else 1
  config.rollouts.partial = "partial" in mode
  config.mesh.rollout_devices = _ROLLOUT_DEVICES.value if mode == "async" else 0
  if config.algo.max_async_level:
    config.algo.old_logp = _OLD_LOGP.value
  workdir = tempfile.mkdtemp(dir=tmp)
  t0 = time.perf_counter()
  devices = jax.devices()[:_DEVICES.value]
  if mode == "sync_trainer":
    devices = devices[_ROLLOUT_DEVICES.value:]
  training.train(config, workdir, devices=devices)
  wall = time.perf_counter() - t0
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f][warmup:]
  med = lambda k: statistics.median(r[k] for r in rows)
  out = {"mode": mode, "step_time_s": med("step_time_s"), "wait_s": med("sample_time_s"),
         "logprob_s": med("logprob_time_s"), "update_s": med("update_time_s"),
         "measured_wall_s": sum(r["step_time_s"] for r in rows), "run_wall_s": wall,
         "reward_mean_last": rows[-1]["reward_mean"],
         "response_length_mean": statistics.mean(r["response_length_mean"] for r in rows)}
  if config.algo.max_async_level:
    out["staleness_mean"] = statistics.mean(r["async/staleness_mean"] for r in rows)
  return out


def main(argv):
  del argv
  import jax
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    for mode in _MODES.value:
      r = run(mode, tmp)
      results.append(r)
      print(f"{mode:13s} step {r['step_time_s']:.3f} s (waiting for the rollout "
            f"{r['wait_s']:.3f} s, log-probs {r['logprob_s']:.3f} s, update {r['update_s']:.3f} s)"
            f" | measured steps {r['measured_wall_s']:.1f} s", flush=True)
  sync = next((r for r in results if r["mode"] in ("sync", "tail")), None)
  if sync is not None:
    for r in results:
      r["vs_sync"] = r["step_time_s"] / sync["step_time_s"]
  summary = {"devices": _DEVICES.value, "platform": jax.devices()[0].platform,
             "rollout_devices": _ROLLOUT_DEVICES.value, "results": results}
  print("RESULT " + json.dumps(summary))  # what bench/gpu.py reads


if __name__ == "__main__":
  app.run(main)
