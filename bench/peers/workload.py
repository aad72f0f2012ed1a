"""tiny-grpo-cpu: the one GRPO workload that TRL, tunix and jaxrl_llm are timed on.

Everything the three runners must agree on lives here, so that they differ only in
the stack that executes the step:

* `MODEL`: a random Llama of 3,410,176 float32 parameters (vocab 512, hidden 256,
  MLP 768, 4 layers, 4 query heads and 2 KV heads of 64, RoPE theta 1e4, RMSNorm
  eps 1e-6, lm_head not tied to the embedding). Small enough that a step takes
  about a second on two CPU cores, large enough that the matmuls dominate.
* `prompts()`: 8 fixed prompts of 32 lowercase letters. With the character-level
  tokenizer of `build_tokenizer` (one token per printable ASCII character, nothing
  added around a text) each prompt is exactly 32 tokens, so no stack pads.
* `frac_a`: the reward, the fraction of a completion's characters that are 'a'.
  It costs nothing, so the step time is the stacks' own work.
* The GRPO settings (`GROUP` completions per prompt, `NEW_TOKENS`, `BETA`, ...):
  each runner maps them onto its stack's options.
* `flops_per_step()`: the analytic work of one step (207 GFLOP), for the table's
  ratio to a measured matmul rate.
* `Recorder`: what every run reports, written as one JSON file: wall times, peak
  RSS, and how much CPU *other* processes took meanwhile (a benchmark on two cores
  that other processes can also use is only meaningful when that is near zero).

This file uses the standard library only (the tokenizer builder imports
`tokenizers`/`transformers` when called), so each stack's own virtual environment,
which does not have jaxrl_llm installed, imports it by path:

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import workload

`python workload.py` prints the parameter count and the FLOP budget.
"""
from __future__ import annotations

import json
import os
import platform
import random
import resource
import statistics
import string
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
NAME = "tiny-grpo-cpu"

# ----------------------------------------------------------------------------- model
MODEL = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,  # >= PROMPT_LEN + NEW_TOKENS; adds no parameters (RoPE)
    tie_word_embeddings=False,
)
PARAMS = 3_410_176
SEED = 0

# ----------------------------------------------------------------------------- GRPO step
NUM_PROMPTS = 8  # prompts per step
PROMPT_LEN = 32  # characters = tokens
GROUP = 8  # G, completions per prompt: 64 completions per step, one optimizer batch
NEW_TOKENS = 64  # every completion is exactly this long (EOS never ends one early)
TEMPERATURE = 1.0  # no top-k, no top-p
BETA = 0.04  # KL coefficient, k3 estimator, frozen reference = the initial policy
CLIP_EPS = 0.2  # PPO ratio clip, both sides
LR = 1e-5  # AdamW, constant, no weight decay
GRAD_CLIP = 1.0  # global gradient norm
WARMUP_STEPS = 2  # left out of the medians: compilation, allocator warm-up
MEASURED_STEPS = 8
TOTAL_STEPS = WARMUP_STEPS + MEASURED_STEPS

# ----------------------------------------------------------------------------- tokenizer
# Ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 <unk>, then 4 + (ord(c) - 32) for the printable ASCII
# characters ' ' .. '~', then fillers up to the model's vocabulary. This is the same
# numbering as jaxrl_llm's built-in character tokenizer, but it is built here so that all
# three stacks load the very same tokenizer files.
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


def vocabulary() -> list[str]:
  """The tokens in id order, `MODEL["vocab_size"]` of them."""
  tokens = list(SPECIAL_TOKENS) + [chr(c) for c in range(32, 127)]
  tokens += [f"<x{i}>" for i in range(MODEL["vocab_size"] - len(tokens))]
  return tokens


def build_tokenizer(path: str):
  """Builds the character-level tokenizer, saves it in `path` and returns it.

  A `tokenizers` WordLevel model that splits a text into single characters, wrapped
  in transformers' `PreTrainedTokenizerFast` (so every stack loads it with
  `from_pretrained`); no BOS/EOS is added when encoding, padding is on the left.
  Nothing is downloaded.
  """
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  ids = {token: i for i, token in enumerate(vocabulary())}
  core = Tokenizer(models.WordLevel(vocab=ids, unk_token="<unk>"))
  core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  core.decoder = decoders.Fuse()
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>",
                                      bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
  tokenizer.padding_side = "left"
  tokenizer.save_pretrained(path)
  assert all(len(tokenizer(p)["input_ids"]) == PROMPT_LEN for p in prompts())
  return tokenizer


# ----------------------------------------------------------------------------- data, reward
def prompts() -> list[str]:
  """The step's prompts: `NUM_PROMPTS` strings of `PROMPT_LEN` random lowercase letters
  (seeded, so every run and every stack sees the same ones)."""
  rng = random.Random(SEED)
  return ["".join(rng.choices(string.ascii_lowercase, k=PROMPT_LEN)) for _ in range(NUM_PROMPTS)]


def frac_a(completion: str) -> float:
  """The reward of one completion: the fraction of its characters that are 'a'."""
  return completion.count("a") / len(completion) if completion else 0.0


# ----------------------------------------------------------------------------- work per step
def param_count() -> dict[str, int]:
  """Parameters of `MODEL`: all of them, and those that multiply every token (the
  projections and lm_head; not the embedding table or the norms)."""
  m = MODEL
  h, f, vocab = m["hidden_size"], m["intermediate_size"], m["vocab_size"]
  q = m["num_attention_heads"] * m["head_dim"]
  kv = m["num_key_value_heads"] * m["head_dim"]
  per_layer = h * q + 2 * h * kv + q * h + 3 * h * f  # q, k, v, o; gate, up, down
  dense = m["num_hidden_layers"] * per_layer + vocab * h  # + lm_head
  norms = (2 * m["num_hidden_layers"] + 1) * h
  return dict(total=dense + vocab * h + norms, dense=dense)


def flops_per_step() -> dict[str, float]:
  """Analytic FLOPs of one GRPO step (multiply-add = 2 FLOPs).

  A token costs 2 x dense parameters in the projections, plus attention: per layer
  QK^T and AV are 2 x 2 x (heads x head_dim) FLOPs for each earlier position it
  attends to. With B = 64 rows of 32 prompt + 64 new tokens:

  * generation: a prefill of the prompts, then 64 single-token decode steps, each
    attending to the KV cache so far;
  * reference log-probs: one forward pass over all 96 positions;
  * policy: one forward and backward pass over the same, backward counted as twice
    the forward (3 forwards).

  About 41.5 + 41.5 + 124.5 = 207 GFLOP. Stacks that recompute activations (TRL with
  gradient checkpointing, jaxrl_llm's `remat`) do more work than this; the figure is the
  model's work, the same for all, so its ratio to a matmul rate compares like with like.
  """
  dense = param_count()["dense"]
  m = MODEL
  layers, width = m["num_hidden_layers"], m["num_attention_heads"] * m["head_dim"]
  rows = NUM_PROMPTS * GROUP
  seq = PROMPT_LEN + NEW_TOKENS
  attend = lambda positions: 4 * layers * width * positions  # one query over `positions` keys
  forward = rows * (2 * dense * seq + sum(attend(t) for t in range(1, seq + 1)))
  prefill = rows * (2 * dense * PROMPT_LEN + sum(attend(t) for t in range(1, PROMPT_LEN + 1)))
  decode = rows * sum(2 * dense + attend(PROMPT_LEN + k + 1) for k in range(NEW_TOKENS))
  out = dict(generation=prefill + decode, reference=forward, policy=3 * forward)
  out["total"] = sum(out.values())
  return out


# ----------------------------------------------------------------------------- measurement
def summary(values) -> dict:
  """Median, min, max and the values themselves."""
  values = [float(v) for v in values]
  return dict(median=statistics.median(values), min=min(values), max=max(values),
              n=len(values), all=values)


def _machine_busy_s() -> float:
  """CPU seconds all cores have spent busy since boot (/proc/stat, first line)."""
  with open("/proc/stat") as f:
    fields = [int(x) for x in f.readline().split()[1:]]
  user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
  del idle, iowait
  return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
  """CPU seconds of this process (every thread) and its waited-for children."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


class Recorder:
  """Times a run and writes its result file.

  Created first thing in a runner: from then on a background thread samples, every
  `interval` seconds, how busy the whole machine was and how much of that was this
  process, so the result says how many cores *other* processes used during the run
  (`others_cores_avg`, and the worst interval `others_cores_max`). A few reads of
  /proc per second cost nothing next to the benchmark.
  """

  def __init__(self, bench: str, round_: int, results_dir: str = RESULTS_DIR,
               interval: float = 1.0):
    self.bench, self.round, self.results_dir = bench, round_, results_dir
    self.started = time.time()
    self._t0 = time.perf_counter()
    self._busy0, self._own0 = _machine_busy_s(), _own_cpu_s()
    self._interval_max = 0.0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)
    self._thread.start()

  def _sample(self, interval: float) -> None:
    last = (time.perf_counter(), _machine_busy_s(), _own_cpu_s())
    while not self._stop.wait(interval):
      now = (time.perf_counter(), _machine_busy_s(), _own_cpu_s())
      wall = now[0] - last[0]
      others = max(0.0, (now[1] - last[1]) - (now[2] - last[2]))
      self._interval_max = max(self._interval_max, others / wall if wall > 0 else 0.0)
      last = now

  def load(self) -> dict:
    """CPU use on the machine since the recorder started."""
    wall = time.perf_counter() - self._t0
    busy = _machine_busy_s() - self._busy0
    own = _own_cpu_s() - self._own0
    others = max(0.0, busy - own)
    return dict(wall_s=wall, machine_busy_cpu_s=busy, own_cpu_s=own, others_cpu_s=others,
                others_cores_avg=others / wall if wall > 0 else 0.0,
                others_cores_max=self._interval_max, cores=os.cpu_count(),
                loadavg_end=list(os.getloadavg()))

  def save(self, result: dict) -> str:
    """Writes `result` with the run's identity, peak RSS and machine load as
    <results_dir>/<bench>_r<round>.json; prints it; returns the path."""
    self._stop.set()
    self._thread.join()
    record = dict(bench=self.bench, round=self.round, workload=NAME,
                  started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
                  host=dict(node=platform.node(), machine=platform.machine(),
                            python=platform.python_version(), cpu=_cpu_model()),
                  gflop_per_step=flops_per_step()["total"] / 1e9,
                  peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    record.update(result)
    record["load"] = self.load()
    os.makedirs(self.results_dir, exist_ok=True)
    path = os.path.join(self.results_dir, f"{self.bench}_r{self.round}.json")
    with open(path, "w") as f:
      json.dump(record, f, indent=1)
    print(f"wrote {path}")
    print("RESULT " + json.dumps({k: v for k, v in record.items() if k != "host"}))
    return path


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def runner_args(default_bench: str, doc: str = "", add=None):
  """The command line every runner takes: --round N, --bench NAME, --results DIR
  (`add(parser)` adds a runner's own options). Pass `.bench`, `.round` and `.results`
  on to `Recorder`."""
  import argparse
  parser = argparse.ArgumentParser(description=doc or f"{NAME} benchmark: {default_bench}",
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--round", type=int, default=1, help="round of the sitting (file name)")
  parser.add_argument("--bench", default=default_bench, help="result name (file name)")
  parser.add_argument("--results", default=RESULTS_DIR, help="where the JSON goes")
  if add is not None:
    add(parser)
  return parser.parse_args()


if __name__ == "__main__":
  counts, work = param_count(), flops_per_step()
  print(f"{NAME}: {counts['total']:,} parameters ({counts['dense']:,} in per-token matmuls)")
  print("GFLOP per step: " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in work.items()))
  print(f"prompts: {prompts()[:2]} ...")
  sys.exit(0 if counts["total"] == PARAMS else 1)
