"""tiny-grpo-cpu on Hugging Face TRL's GRPOTrainer (TRL 1.16, PyTorch on the CPU).

Run with the TRL environment that setup.sh builds:

  $PEERS/trl/bin/python bench/peers/trl_grpo.py --round 1

The workload's random Llama is built with transformers (`LlamaForCausalLM`, seeded)
and saved with the workload's tokenizer to a temporary directory, because TRL loads
its frozen reference model from the policy's `name_or_path`. Nothing is downloaded.

How the workload maps onto `GRPOConfig`:
* one optimizer step per generation batch: `per_device_train_batch_size` = 64
  completions, `num_generations` = G = 8, no gradient accumulation,
  `num_iterations` = 1 (so no old-policy log-probs are computed: the ratio is 1);
* exactly 64 new tokens: `max_completion_length=64` and `min_new_tokens=64` passed to
  `generate` (EOS is suppressed until the 64th token);
* temperature 1.0, `top_k=0`, `top_p=1.0`: plain sampling;
* `loss_type="grpo"`: each completion's mean token loss, averaged over completions
  (TRL's default is "dapo"); `beta=0.04` (TRL's KL is the k3 estimator), `epsilon=0.2`;
* AdamW (`adamw_torch`), lr 1e-5 constant, no weight decay, `max_grad_norm=1.0`;
* `gradient_checkpointing=False`: TRL turns it on by default, which recomputes the
  forward pass in the backward; off, the model's work is the same as the others'.
  `--gradient-checkpointing` measures TRL's default instead (a different row).

What is timed (wall clock, `time.perf_counter`):
* step: from the end of one optimizer step to the end of the next (a `TrainerCallback`'s
  `on_step_end`), the first from the start of `trainer.train()`; it holds everything:
  data loading, generation, reward, reference log-probs, forward, backward, AdamW,
  TRL's logging;
* sample: the trainer's `_generate_single_turn` (prompt padding, `model.generate`,
  EOS masking);
* ref log-probs: `_get_per_token_logps_and_entropies` called on the reference model
  (its forward pass and the log-softmax gather);
* update: from the end of `_prepare_inputs` (generation, rewards, advantages and the
  reference done) to the end of the step: forward, backward, clipping, AdamW.
These wrap the trainer's own methods on the instance; TRL runs unmodified.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workload as W  # noqa: E402


def build_model(path: str):
  """Saves the workload's random Llama (float32) and tokenizer in `path`; returns both."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM

  tokenizer = W.build_tokenizer(path)
  torch.manual_seed(W.SEED)
  config = LlamaConfig(**W.MODEL, attention_bias=False, mlp_bias=False,
                       pad_token_id=W.PAD_ID, bos_token_id=W.BOS_ID, eos_token_id=W.EOS_ID)
  model = LlamaForCausalLM(config).to(torch.float32)
  n = sum(p.numel() for p in model.parameters())
  assert n == W.PARAMS, n
  model.save_pretrained(path)
  return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer


def main():
  args = W.runner_args("trl_grpo", __doc__, lambda p: p.add_argument(
      "--gradient-checkpointing", action="store_true",
      help="keep TRL's default gradient checkpointing (not the baseline)"))
  if args.gradient_checkpointing and args.bench == "trl_grpo":
    args.bench = "trl_grpo_gc"
  recorder = W.Recorder(args.bench, args.round, args.results)

  import datasets
  import torch
  import transformers
  import trl
  from transformers import TrainerCallback

  tmp = tempfile.mkdtemp(prefix="trl_grpo_")
  model, tokenizer = build_model(os.path.join(tmp, "model"))

  marks = dict(step_end=[], prepared=[], sample=[], ref=[], lengths=[])

  class StepEnds(TrainerCallback):
    def on_step_end(self, args_, state, control, **kwargs):
      marks["step_end"].append(time.perf_counter())

  def reward(completions, **kwargs):
    return [W.frac_a(c) for c in completions]

  config = trl.GRPOConfig(
      output_dir=os.path.join(tmp, "out"),
      use_cpu=True, bf16=False, fp16=False, seed=W.SEED,
      per_device_train_batch_size=W.NUM_PROMPTS * W.GROUP,
      gradient_accumulation_steps=1,
      num_generations=W.GROUP,
      num_iterations=1,
      max_completion_length=W.NEW_TOKENS,
      generation_kwargs={"min_new_tokens": W.NEW_TOKENS},
      temperature=W.TEMPERATURE, top_k=0, top_p=1.0,
      loss_type="grpo",
      beta=W.BETA,
      epsilon=W.CLIP_EPS,
      optim="adamw_torch", learning_rate=W.LR, lr_scheduler_type="constant",
      warmup_steps=0, weight_decay=0.0, max_grad_norm=W.GRAD_CLIP,
      gradient_checkpointing=args.gradient_checkpointing,
      max_steps=W.TOTAL_STEPS,
      logging_steps=1, save_strategy="no", report_to="none",
      dataloader_num_workers=0, disable_tqdm=True,
  )
  trainer = trl.GRPOTrainer(
      model=model, reward_funcs=reward, args=config, processing_class=tokenizer,
      train_dataset=datasets.Dataset.from_dict({"prompt": W.prompts()}),
      callbacks=[StepEnds()])
  assert trainer.ref_model is not None, "beta > 0 needs a reference model"

  generate_turn = trainer._generate_single_turn  # pylint: disable=protected-access
  token_logps = trainer._get_per_token_logps_and_entropies  # pylint: disable=protected-access
  prepare_inputs = trainer._prepare_inputs  # pylint: disable=protected-access

  def timed_generate(*a, **k):
    t = time.perf_counter()
    completion_ids, logprobs = generate_turn(*a, **k)
    marks["sample"].append(time.perf_counter() - t)
    marks["lengths"].append([len(c) for c in completion_ids])
    return completion_ids, logprobs

  def timed_logps(model_, *a, **k):
    t = time.perf_counter()
    out = token_logps(model_, *a, **k)
    if model_ is trainer.ref_model:
      marks["ref"].append(time.perf_counter() - t)
    return out

  def marked_prepare(*a, **k):
    out = prepare_inputs(*a, **k)
    if trainer.model.training:
      marks["prepared"].append(time.perf_counter())
    return out

  trainer._generate_single_turn = timed_generate  # pylint: disable=protected-access
  trainer._get_per_token_logps_and_entropies = timed_logps  # pylint: disable=protected-access
  trainer._prepare_inputs = marked_prepare  # pylint: disable=protected-access

  t0 = time.perf_counter()
  trainer.train()
  train_s = time.perf_counter() - t0

  n = W.TOTAL_STEPS
  for key in ("step_end", "prepared", "sample", "ref"):
    assert len(marks[key]) == n, (key, len(marks[key]), n)
  assert all(l == W.NEW_TOKENS for ls in marks["lengths"] for l in ls), marks["lengths"]
  assert all(len(ls) == W.NUM_PROMPTS * W.GROUP for ls in marks["lengths"])
  ends = [t0] + marks["step_end"]
  steps = [ends[i + 1] - ends[i] for i in range(n)]
  updates = [e - p for p, e in zip(marks["prepared"], marks["step_end"])]
  w = W.WARMUP_STEPS
  med = lambda xs: W.summary(xs[w:])["median"]
  history = trainer.state.log_history
  recorder.save(dict(
      stack="TRL",
      versions=dict(trl=trl.__version__, torch=torch.__version__,
                    transformers=transformers.__version__),
      torch_threads=torch.get_num_threads(),
      gradient_checkpointing=args.gradient_checkpointing,
      steps=n, warmup=w,
      step_s=W.summary(steps[w:]),
      first_step_s=steps[0],
      sample_s=med(marks["sample"]),
      ref_logprob_s=med(marks["ref"]),
      update_s=med(updates),
      update_is_remainder=False,
      sample_tokens_per_s=W.NUM_PROMPTS * W.GROUP * W.NEW_TOKENS / med(marks["sample"]),
      mean_completion_tokens=W.NEW_TOKENS,
      losses=[h["loss"] for h in history if "loss" in h],
      kl=[h["kl"] for h in history if "kl" in h],
      train_s=train_s,
      all_steps_s=steps,
  ))


if __name__ == "__main__":
  main()
