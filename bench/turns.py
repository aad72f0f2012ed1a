"""Multi-turn sampling against one single-turn completion of the same total tokens.

Workload: bench/sampler.py's standard tiny Llama (4 layers, hidden 256, vocab 512, float32,
random init) on one XLA CPU device; 64 episodes, prompts of 32 tokens; an episode is 3 model
turns of 64 tokens (per-turn budgets, no EOS) with 2 environment replies of 16 tokens
between them (fixed tokens): 224 tokens after the prompt. The multi-turn sampler
(`sampling.turns.TurnSampler`) keeps the cache between turns and prefills only the
replies (and each turn's last token); the single-turn baseline is the static engine
generating 224 tokens per row in one call. Reported: the median of `--reps` timed runs of
each after a warm-up (compile) run, and their ratio.

  python bench/turns.py
"""
import argparse
import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

ROWS, PROMPT_LEN, TURN, REPLY, TURNS = 64, 32, 64, 16, 3
TOTAL = TURNS * TURN + (TURNS - 1) * REPLY


def checkpoint() -> str:
  import torch
  import transformers
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from sampler import MODEL  # the standard workload's model
  torch.manual_seed(0)
  hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      **MODEL, bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
  path = tempfile.mkdtemp()
  hf.save_pretrained(path)
  return path


def median_time(fn, reps):
  from sampler import _median_time  # bench/sampler.py's timing
  fn()  # warm-up: compiles
  return _median_time(fn, reps)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--reps", type=int, default=3)
  args = ap.parse_args()
  path = checkpoint()
  import jax
  from jaxrl_llm import models, sampling
  from jaxrl_llm.sampling import turns
  model = models.from_pretrained(path)
  model = models.Model(jax.device_put(model.params), model.config)
  rng = np.random.RandomState(0)
  prompts = [[int(t) for t in rng.randint(4, 99, PROMPT_LEN)] for _ in range(ROWS)]
  replies = [[int(t) for t in rng.randint(4, 99, REPLY)] for _ in range(ROWS)]
  settings = lambda n: sampling.SamplingSettings(1, n, 1.0, 0, 1.0, (), 0, engine="static")

  multi = turns.TurnSampler(settings(TURN), max_columns=PROMPT_LEN + TURNS * (TURN + 32))

  def episodes():
    multi.start(model, ROWS, jax.random.key(0))
    new = prompts
    for turn in range(TURNS):
      out = multi.turn(model, new, [TURN] * ROWS)
      new = [[int(out.tokens[b, TURN - 1])] + replies[b] for b in range(ROWS)]

  single = sampling.Sampler(settings(TOTAL))
  one_call = lambda: jax.block_until_ready(single(model, prompts, 0).tokens)
  t_multi = median_time(episodes, args.reps)
  t_single = median_time(one_call, args.reps)
  print(f"| sampler | tokens after the prompt | s per batch of {ROWS} |")
  print("|---|---|---|")
  print(f"| {TURNS} turns of {TURN} + {TURNS - 1} replies of {REPLY} (TurnSampler) | {TOTAL} | "
        f"{t_multi:.2f} |")
  print(f"| one completion of {TOTAL} (static engine) | {TOTAL} | {t_single:.2f} |")
  print(f"multi-turn / single-turn: {t_multi / t_single:.2f}x")


if __name__ == "__main__":
  main()
