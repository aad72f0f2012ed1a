"""tiny-grpo-cpu on Google's tunix (0.1.7): GRPOLearner over an RLCluster, JAX on the CPU.

Run with the tunix environment that setup.sh builds:

  $PEERS/tunix/bin/python bench/peers/tunix_grpo.py --round 1

The policy and the frozen reference are two `tunix.models.llama3.Llama3` modules
built from the workload's shape with the same seed (identical weights, separate
copies), float32; tunix's Llama3 does no rematerialisation by default. Actor,
reference and rollout share one single-device mesh (axes fsdp x tp = 1 x 1), the
"vanilla" rollout engine (tunix's own JAX sampler with a KV cache of 32 + 64).

How the workload maps onto tunix:
* one optimizer step per generation batch: each batch of 8 prompts becomes 64
  completions (`num_generations=8`), `mini_batch_size`/`train_micro_batch_size`
  unset, so the whole batch is one optimizer step; `num_iterations=1`;
* exactly 64 new tokens: `max_tokens_to_generate=64` with `eos_tokens=[-1]`, an id no
  sampled token can have, so no completion ends early;
* temperature 1.0, `top_p=1.0`, `top_k=None`: plain categorical sampling;
* `kl_loss_mode="low_var_kl"` is the k3 estimator (tunix's default "kl" is k1),
  `beta=0.04`, `epsilon=0.2`; the default `loss_agg_mode` is
  "sequence-mean-token-mean";
* optax `clip_by_global_norm(1.0)` then `adamw(1e-5)` without weight decay.
* The tokenizer is the workload's, with its BOS token removed: tunix's sampler
  prepends BOS whenever the tokenizer has one, and the others do not, so prompts
  stay 32 tokens.

What is timed (wall clock; each timed call waits for its device results):
* step: from the end of one actor update to the end of the next, the first from the
  start of `learner.train`; it holds data loading, generation, reward, reference
  log-probs, advantages and the update;
* sample: `RLCluster.generate`;
* ref log-probs: `RLCluster.get_ref_per_token_logps`;
* update: `RLCluster.update_actor` (forward, backward, clipping, AdamW).
These wrap the cluster's public methods on the instance; tunix runs unmodified.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workload as W  # noqa: E402


def make_llama(seed: int):
  """A random tunix Llama3 of the workload's shape."""
  from flax import nnx
  from tunix.models.llama3 import model as llama3

  m = W.MODEL
  config = llama3.ModelConfig(
      num_layers=m["num_hidden_layers"], vocab_size=m["vocab_size"],
      embed_dim=m["hidden_size"], hidden_dim=m["intermediate_size"],
      num_heads=m["num_attention_heads"], head_dim=m["head_dim"],
      num_kv_heads=m["num_key_value_heads"], rope_theta=int(m["rope_theta"]),
      norm_eps=m["rms_norm_eps"], weight_tying=m["tie_word_embeddings"])
  return llama3.Llama3(config, rngs=nnx.Rngs(seed))


def main():
  args = W.runner_args("tunix_grpo", __doc__)
  recorder = W.Recorder(args.bench, args.round, args.results)

  import jax
  import numpy as np
  import optax
  from flax import nnx
  from grain import python as grain
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout

  tokenizer = W.build_tokenizer(tempfile.mkdtemp(prefix="tunix_grpo_"))
  tokenizer.bos_token = None

  # A Mesh built directly has Auto axis types; tunix 0.1.7's models reject the Explicit
  # axes that `jax.make_mesh` now defaults to.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
  with mesh:
    actor, reference = make_llama(W.SEED), make_llama(W.SEED)
  params = jax.tree.leaves(nnx.state(actor, nnx.Param))
  assert sum(p.size for p in params) == W.PARAMS
  assert all(p.dtype == np.float32 for p in params)

  rl = rl_cluster_lib
  cluster = rl.RLCluster(
      actor=actor, reference=reference, tokenizer=tokenizer,
      cluster_config=rl.ClusterConfig(
          role_to_mesh={rl.Role.ACTOR: mesh, rl.Role.REFERENCE: mesh, rl.Role.ROLLOUT: mesh},
          rollout_engine="vanilla",
          offload_to_cpu=False,
          training_config=rl.RLTrainingConfig(
              actor_optimizer=optax.chain(
                  optax.clip_by_global_norm(W.GRAD_CLIP),
                  optax.adamw(W.LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)),
              max_steps=W.TOTAL_STEPS,
              eval_every_n_steps=10 ** 6,
              pbar_description=None),
          rollout_config=base_rollout.RolloutConfig(
              max_tokens_to_generate=W.NEW_TOKENS,
              max_prompt_length=W.PROMPT_LEN,
              kv_cache_size=W.PROMPT_LEN + W.NEW_TOKENS,
              temperature=W.TEMPERATURE, top_p=1.0, top_k=None,
              eos_tokens=[-1])))

  marks = dict(sample=[], ref=[], update=[], update_end=[], lengths=[])
  generate, ref_logps, update_actor = (cluster.generate, cluster.get_ref_per_token_logps,
                                       cluster.update_actor)

  def timed_generate(*a, **k):
    t = time.perf_counter()
    out = generate(*a, **k)
    jax.block_until_ready(out.tokens)
    marks["sample"].append(time.perf_counter() - t)
    marks["lengths"].append([len(x) for x in out.tokens])
    return out

  def timed_ref(*a, **k):
    t = time.perf_counter()
    out = jax.block_until_ready(ref_logps(*a, **k))
    marks["ref"].append(time.perf_counter() - t)
    return out

  def timed_update(*a, **k):
    t = time.perf_counter()
    out = update_actor(*a, **k)
    jax.block_until_ready(nnx.state(cluster.actor_trainer.model, nnx.Param))
    now = time.perf_counter()
    marks["update"].append(now - t)
    marks["update_end"].append(now)
    return out

  cluster.generate = timed_generate
  cluster.get_ref_per_token_logps = timed_ref
  cluster.update_actor = timed_update

  def reward(prompts, completions, **kwargs):
    return [W.frac_a(c) for c in completions]

  learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster,
      algo_config=grpo_learner.GRPOConfig(
          num_generations=W.GROUP, num_iterations=1, beta=W.BETA,
          kl_loss_mode="low_var_kl", epsilon=W.CLIP_EPS,
          loss_agg_mode="sequence-mean-token-mean"),
      reward_fns=reward)
  batches = (grain.MapDataset.source(W.prompts() * (W.TOTAL_STEPS + 1))
             .batch(W.NUM_PROMPTS)
             .map(lambda prompts: {"prompts": prompts}))

  t0 = time.perf_counter()
  learner.train(batches)
  train_s = time.perf_counter() - t0

  n = W.TOTAL_STEPS
  for key in ("sample", "ref", "update"):
    assert len(marks[key]) >= n, (key, len(marks[key]), n)
  assert all(l == W.NEW_TOKENS for ls in marks["lengths"] for l in ls), marks["lengths"]
  ends = [t0] + marks["update_end"][:n]
  steps = [ends[i + 1] - ends[i] for i in range(n)]
  w = W.WARMUP_STEPS
  med = lambda xs: W.summary(xs[w:n])["median"]
  trained = jax.tree.leaves(nnx.state(cluster.actor_trainer.model, nnx.Param))
  frozen = jax.tree.leaves(nnx.state(reference, nnx.Param))
  moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
              for a, b in zip(trained, frozen))
  try:
    logger = cluster.actor_trainer.metrics_logger
    history = {k: [float(x) for x in logger.get_metric_history("actor", k, "train")]
               for k in ("loss", "kl")}
  except Exception as e:  # pylint: disable=broad-except  (the metrics API moves between versions)
    history = {"error": repr(e)}
  import flax
  from importlib.metadata import version
  recorder.save(dict(
      stack="tunix",
      versions=dict(tunix=version("google-tunix"), jax=jax.__version__,
                    flax=flax.__version__, optax=optax.__version__),
      devices=str(jax.devices()),
      steps=n, warmup=w,
      step_s=W.summary(steps[w:]),
      first_step_s=steps[0],
      sample_s=med(marks["sample"]),
      ref_logprob_s=med(marks["ref"]),
      update_s=med(marks["update"]),
      update_is_remainder=False,
      sample_tokens_per_s=W.NUM_PROMPTS * W.GROUP * W.NEW_TOKENS / med(marks["sample"]),
      mean_completion_tokens=W.NEW_TOKENS,
      max_param_change_vs_reference=moved,
      metrics=history,
      train_s=train_s,
      all_steps_s=steps,
  ))


if __name__ == "__main__":
  main()
