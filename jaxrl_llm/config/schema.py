"""The config schema: every section, its defaults and what each field means.

`base_config()` is a full config with every field the library reads, GRPO's algorithm
axes and a tiny random Llama; a preset (configs/, `jaxrl_llm.config.preset`) changes what
makes it that experiment, and `print(config)` shows the whole run. The comment beside a
field says what it means and which values it takes; `jaxrl_llm.config.validate` checks
every value against these choices, once, before anything loads. The algorithm axes
(`algo`) are described in docs/objectives.md.
"""
from __future__ import annotations

import ml_collections

from jaxrl_llm.config.env_schema import env_config

ConfigDict = ml_collections.ConfigDict
# A preset sets a field to this when only the user can fill it (a model or data path);
# `validate` refuses the config until the field is set.
REQUIRED = "<required>"
# prime-rl's opsd hint (`OPSDAlgoConfig.template`), a system message before the prompt.
HINT_TEMPLATE = ("Here is an example of an expert response:\n<demonstration>\n{demonstration}\n"
                 "</demonstration>")


def model_config() -> ConfigDict:
  """Policy (and reference/value backbone) model: a tiny Llama unless `path` is set."""
  return ConfigDict({
      "path": "",  # local HF checkpoint dir; '' = build from `arch`
      "tokenizer_path": "",  # '' = model.path (or the built-in character tokenizer)
      "dtype": "float32",
      "param_dtype": "float32",
      "remat": "full",  # full | dots (keep matmul outputs) | none: what backward keeps per layer
      "attention": "auto",  # auto | xla | blockwise | cudnn | splash (training attention kernel)
      # MoE models (docs/moe.md): the update's router losses (-1: config.json's
      # router_aux_loss_coef; the built-in arch's is 0), and how the experts run
      "router_aux_loss_coef": -1.0,
      "router_z_loss_coef": 0.0,
      "moe_impl": "auto",  # auto | gmm (megablox; TPU) | ragged (jax.lax.ragged_dot) | blocked
      "arch": {
          "model_type": "llama",
          "vocab_size": 512,
          "hidden_size": 64,
          "intermediate_size": 128,
          "num_layers": 2,
          "num_heads": 4,
          "num_kv_heads": 2,
          "head_dim": 16,
          "rope_theta": 10000.0,
          "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False,
          "max_position_embeddings": 512,
          # model_type qwen3_moe or mixtral: every layer's MLP is num_experts experts of width
          # moe_intermediate_size, num_experts_per_tok of them per token
          "num_experts": 0,
          "num_experts_per_tok": 2,
          "moe_intermediate_size": 64,
          "norm_topk_prob": True,
      },
  })


def lora_config() -> ConfigDict:
  """LoRA adapters on the policy (docs/lora.md): only they train; the base is frozen and,
  with the adapters off, is the reference model."""
  return ConfigDict({
      "rank": 0,  # r of every adapter; 0 = full fine-tuning
      "alpha": 16.0,  # the adapters' scale is alpha / rank (PEFT's lora_alpha)
      # comma-separated, of qkv_proj (q, k and v: one adapter), o_proj, gate_up_proj (gate
      # and up: one adapter), down_proj; 'all' = every one
      "targets": "all",
      "dropout": 0.0,  # on each adapter's input in the update (one key per step)
      "base_quant": "none",  # none | int8: the frozen base's projections stored in int8 (QLoRA)
  })


def teacher_config() -> ConfigDict:
  """A frozen teacher for on-policy distillation (`algo.distill`), sharded like the reference."""
  return ConfigDict({
      "path": "",  # HF checkpoint dir, local or gs://; '' = no teacher. Must share the tokenizer
  })


JUDGE_TEMPLATE = (
    "Rate how well the response answers the question, from 0 (wrong or unhelpful) to 10 "
    "(correct and complete).\n\nQuestion:\n{prompt}\n\nResponse:\n{completion}\n\n"
    "Reply with 'Score: N' and nothing else.")


def judge_config() -> ConfigDict:
  """A reward model or an LLM judge scoring completions (jaxrl_llm/rewards/judge.py)."""
  return ConfigDict({
      "path": "",  # HF checkpoint dir, local or gs://; '' = no judge. Its own tokenizer
      "kind": "classifier",  # a reward model's score head | generative: `template` answered
      "weight": 1.0,  # the judge's weight in the reward total (logged as reward/judge)
      "sources": (),  # names of config.sources it scores; () = every source
      "chat": True,  # render through the judge tokenizer's chat template (when it has one)
      "template": JUDGE_TEMPLATE,  # generative: {prompt}, {completion} and the record's fields
      # generative: a regex whose first group is the score (the last match counts), or a
      # function "pkg.module:fn" (verdict text -> float or None)
      "parser": r"[Ss]core:\s*(-?\d+(?:\.\d+)?)",
      "unparsed": 0.0,  # generative: the score of a verdict without one
      "max_len": 1024,  # judge tokens per text; a longer text keeps its last max_len
      "max_new_tokens": 32,  # generative: the verdict's length at most
      "batch_size": 64,  # texts per judge program (rounded up to a multiple of the devices)
  })


def mesh_config() -> ConfigDict:
  """Device mesh and the logical-axis -> mesh-axes rules (see jaxrl_llm/sharding.py)."""
  return ConfigDict({
      "data": -1,  # -1: all devices the other axes leave
      "fsdp": 1,
      "expert": 1,  # expert parallelism: an MoE layer's experts split over this many devices
      "context": 1,  # context parallelism: the update's sequences split over this many devices
      "tensor": 1,
      # n > 0: the sampler's own n devices (tensor-parallel), the mesh above the rest; 0: shared
      "rollout_devices": 0,
      # The TPU slice a recipe is sized for, e.g. 'v5p:2x2x4' ('' = none), and how many such
      # slices (multislice: over the data-center network, the data axis spans them). Read by
      # launch.compile when no --topology is given; training runs on the devices it has.
      "topology": "",
      "num_slices": 1,
      "rules": (
          ("batch", ("data", "fsdp", "expert")),
          ("embed", "fsdp"),
          ("heads", "tensor"),
          ("kv_heads", "tensor"),
          ("mlp", "tensor"),
          ("vocab", "tensor"),
          ("head_dim", None),
          ("seq", "context"),
          ("cache_seq", None),
          ("layers", None),
          ("expert", "expert"),
      ),
  })


def sampling_config() -> ConfigDict:
  """The rollout sampler (jaxrl_llm/sampling/) and the prompts' padding buckets."""
  return ConfigDict({
      "num_samples": 8,  # G, responses per prompt
      "max_new_tokens": 64,
      "temperature": 1.0,
      "top_k": 0,  # 0 = off
      "top_p": 1.0,
      "max_prompt_len": 128,
      "prompt_buckets": (32, 64, 128),  # prompts pad to the smallest bucket that fits
      "layer_loop": "auto",  # auto | scan | unrolled: how sampling runs the layers (sampling/decode.py)
      "weight_layout": "tensor",  # tensor | replicated | training: weights while decoding
      "engine": "auto",  # auto | static | continuous: README, "Sampling engines"
      "slots": 0,  # continuous engine: decode slots (0 = half of the completions)
      "page_size": 32,  # continuous engine: tokens per KV page
      # continuous engine: pages each engine keeps for completions, so the KV pool's memory
      # (launch.compile); 0 = every slot at max_new_tokens. Fewer (at least one completion's,
      # ceil(max_new_tokens / page_size)): requests wait for free pages, and a slot that
      # cannot grow preempts the latest admitted one, recomputed later (README, "Sampling engines")
      "kv_pages": 0,
      # episodes on the serving engine (multi-turn, agent programs): prompt or reply columns
      # prefilled per engine step, between other episodes' decode steps; a multiple of
      # page_size; 0 = whole (docs/serving.md, "Chunked prefill")
      "prefill_chunk": 0,
      # LoRA (config.lora): merged (into the kernels, once per call; an int8 base becomes
      # compute-dtype weights while sampling) | applied (beside the kernels at every step;
      # the base stays as stored). bench/lora.py has both
      "adapters": "merged",
  })


def _loss_config() -> dict:
  """`algo.loss`: the policy-gradient term, its ratio, trust region and aggregation."""
  return {
      "pg_coef": 1.0,  # weight of the policy-gradient term; 0: pure distillation (opd)
      "ratio": "token",  # token | sequence | sequence_token | none
      "trust_region": "clip",  # clip | cispo | gmpo | sapo | dppo_tv | ipo | none
      "clip_low": 0.2,
      "clip_high": 0.2,
      "dual_clip": 0.0,  # 0 = off, else c > 1
      "tau_pos": 1.0,  # sapo only
      "tau_neg": 1.05,  # sapo only
      "prob_low": 0.2,  # dppo_tv / ipo: largest fall of a token's probability pi - mu
      "prob_high": 0.2,  # dppo_tv / ipo: largest rise
      "log_ratio_coef": 1e-3,  # dppo_tv / ipo: weight of (log rho)^2 per token
      "aggregation": "seq_mean_token_mean",
      "norm_length": 0,  # seq_mean_token_sum_norm only
      "entropy_coef": 0.0,
      "reducer": "",  # user reducer "pkg.module:fn": fn(loss_BT, mask_BT, counts, loss_cfg)
  }


def algo_config(sampling: ConfigDict) -> ConfigDict:
  """The algorithm as data: one choice per axis (docs/objectives.md), GRPO's values."""
  algo = ConfigDict({
      "advantage": {
          "estimator": "grpo",
          "fn": "",  # user estimator "pkg.module:fn" / "file.py:fn": fn(rewards_PG, cfg)
          "std_ddof": 0,  # 0 population std (seeds' examples), 1 unbiased (TRL, verl)
          "eps": 1e-6,
          "scale": "group",  # group | batch | none
          "gamma": 1.0,
          "lam": 1.0,
          "whiten": False,  # gae only: whiten advantages over the batch's valid tokens
          "decay": 0.95,  # rae only: b <- decay*b + (1 - decay)*r after each row
      },
      "loss": _loss_config(),
      "kl": {
          "coef": 0.04,
          "estimator": "k3",  # k1 | k2 | k3
          "placement": "loss",  # loss | reward | none
      },
      # On-policy distillation from config.teacher (objectives/distillation.py): coef weighs
      # prime-rl's opd loss term (token mean of -m*sg(log pT - log p)*rho + log_ratio_coef*
      # (log rho)^2, m = 0 where p - mu < -mask_low); shaping_coef is miles' advantage shaping
      # A - shaping_coef*(old_logp - teacher_logp). Both 0: no teacher is read.
      # teacher: 'model' (config.teacher) or 'self' (prime-rl's opsd: the live policy scores
      # each completion after a hint, a system message of hint_template holding the record's
      # hint_field; the hint's tokens, at most max_hint_len, are sliced off).
      "distill": {"coef": 0.0, "mask_low": 0.2, "log_ratio_coef": 1e-3, "shaping_coef": 0.0,
                  "teacher": "model", "hint_field": "demonstration",
                  "hint_template": HINT_TEMPLATE, "max_hint_len": 128},
      "value": {
          "coef": 0.0,  # > 0 only with a value model (gae)
          "value_clip": 0.2,
      },
      # echo (prime-rl): cross-entropy on the environment's tokens of each role, weighted by its
      # alpha and normalised over its own token count; 0 = off (multi-turn sources only)
      "echo": {"tool": 0.0, "user": 0.0},
      "num_iterations": 1,  # passes over each rollout batch
      "num_minibatches": 1,  # optimizer steps per pass
      # sampler | recompute | auto: recompute when the model computes in bf16/fp16 and the loss
      # has an importance ratio (the sampler's decode numerics then differ from the trainer's)
      "old_logp": "auto",
      "tis_cap": 0.0,  # truncated IS weight cap for sampler/trainer mismatch; 0 = off
      # Off-policy corrections against the recorded behaviour log-probs b (docs/objectives.md): with
      # w = exp(o - b), o the trainer's recomputed old log-probs, tis_cap multiplies each token's
      # loss by min(w, tis_cap); behaviour_mask (IcePop) drops tokens ('token') or whole responses
      # ('sequence': geometric mean of w) with w outside [low, high] from the loss and its counts,
      # logging behaviour_mask_frac. Both act only with old_logp 'recompute' (what 'auto' picks
      # with a mask, or in bf16); with 'sampler', o = b and w = 1.
      "behaviour_mask": {"level": "off", "low": 0.5, "high": 2.0},  # off | token | sequence
      # MoE policies: off | rollout (R3: the old-log-prob pass and the update route every token
      # to the experts the sampler chose, weighted by the live router; not with partial
      # rollouts)
      "routing_replay": "off",
      # Asynchronous rollouts: the rollouts of step s may come from the policy after update
      # s - max_async_level (sampled while the updates in between run); 0 = synchronous.
      "max_async_level": 0,
      "dynamic_sampling": {"enabled": False, "max_rounds": 3},
      "overlong": {
          "enabled": False,
          "max_len": 0,
          "cache_len": 0,
          "mask_truncated": False,  # truncated responses get no loss
      },
  })
  algo.overlong.max_len = sampling.get_ref("max_new_tokens")
  return algo


def optimizer_config() -> ConfigDict:
  """AdamW with global-norm clipping, for the policy and the critic alike."""
  return ConfigDict({
      # adamw (the only optimizer so far)
      "name": "adamw",
      "lr": 1e-6,  # the peak learning rate, > 0
      "b1": 0.9,
      "b2": 0.999,
      "eps": 1e-8,
      "weight_decay": 0.0,
      "grad_clip_norm": 1.0,  # clip the global gradient norm to this; 0 = off
      "schedule": "constant",  # constant | cosine
      "warmup_steps": 0,  # linear warm-up from 0, in optimizer updates
  })


def train_config() -> ConfigDict:
  """The run's length, batch and cadence."""
  return ConfigDict({
      "steps": 200,  # RL steps (sample -> update), >= 1
      "prompts_per_step": 16,  # P; B = P·G sequences per rollout batch
      "micro_batch_size": 32,  # sequences per forward/backward; gradients accumulate
      "eval_every": 50,  # held-out greedy accuracy every N steps (and at step 0); 0 = never
      "log_every": 1,  # a metrics row every N steps (and at the last one), >= 1
      "max_consecutive_skips": 3,  # skipped (non-finite) steps in a row allowed; one more stops
      "peak_flops_per_device": 0.0,  # for MFU; 0.0 = measure
      "logprob_chunk_size": 256,  # sequence positions per logit chunk
  })


def data_config(sampling: ConfigDict) -> ConfigDict:
  """Where prompts (and SFT targets) come from and how they become tokens."""
  data = ConfigDict({
      # task:NAME (built-in, jaxrl_llm/tasks), jsonl:PATH with {split} (local or gs://),
      # tfds:NAME (tensorflow-datasets)
      "source": "task:arithmetic",
      "completions": "sample",  # sample (RL) | dataset (SFT: each record's `completion`)
      "task_options": {},  # keyword arguments of a task: source (see jaxrl_llm.tasks)
      "max_prompt_len": 0,  # follows sampling.max_prompt_len
      "prompt_overflow": "error",  # error | truncate: a prompt longer than max_prompt_len
      "chat_template": False,  # wrap each prompt as a user turn of the tokenizer's template
      "tfds_data_dir": "",  # tfds: sources' data_dir ('' = TFDS's default)
      "shuffle_seed": 0,  # the order of the training records
      **env_config(),
  })
  data.max_prompt_len = sampling.get_ref("max_prompt_len")
  return data


def rewards_config() -> ConfigDict:
  """Reward functions by import path, and their weights in the total."""
  return ConfigDict({
      # import paths "pkg.module:fn"; the first is the eval accuracy. Default: arithmetic's.
      "functions": ("jaxrl_llm.rewards.arithmetic:arithmetic_exact",
                    "jaxrl_llm.rewards.arithmetic:arithmetic_format"),
      "weights": (1.0, 0.1),  # one float per function
  })


def source_config(data: str = "task:arithmetic", weight: float = 1.0) -> ConfigDict:
  """One training source of `config.sources` (`jaxrl_llm/config/sources.py`): its prompts,
  its share of each step, its rewards and its per-row algorithm settings."""
  algo = algo_config(sampling_config())
  return ConfigDict({
      "data": data,  # a spec as data.source takes: task:NAME | jsonl:PATH | tfds:NAME
      "task_options": {},  # keyword arguments of a task: source
      "weight": weight,  # its share of each step's prompts (weights are normalised), >= 0
      "rewards": rewards_config(),
      **env_config(),
      # The per-row algorithm axes: these replace config.algo's for this source's rows.
      # The loss and trust region, the KL and the rest of config.algo stay one per run.
      "algo": {
          "advantage": algo.advantage.to_dict(),
          "loss": {"pg_coef": 1.0},
          "distill": {"coef": 0.0, "shaping_coef": 0.0, "teacher": "model",
                      "hint_field": "demonstration", "hint_template": HINT_TEMPLATE},
      },
  })


def eval_config() -> ConfigDict:
  """Held-out evaluation beyond greedy accuracy (`train.eval_every` says when; `launch.evaluate`
  evaluates a saved model): K sampled completions per record for pass@k and maj@K."""
  return ConfigDict({
      # K completions per eval record at the sampling temperature and top_p, for pass@k
      # (eval/pass@k/k; eval/SOURCE/pass@k/k in a mixed run); 0 = greedy only. Also
      # launch.evaluate's default --samples (else sampling.num_samples)
      "num_samples": 0,
      # the k's of pass@k, each in [1, num_samples]; () = 1, 2, 4, ... up to num_samples (and
      # num_samples itself)
      "pass_k": (),
      "correct_at": 1.0,  # a sample is correct when its reward total reaches this
      # 'pkg.module:fn' (or 'file.py:fn'): completion -> answer str or None, maj@K's vote;
      # '' = the task's own (arithmetic, GSM8K, countdown, calculator), else the last line
      "answer_extractor": "",
  })


def rollouts_config() -> ConfigDict:
  """How sampled rollouts are produced, beside `algo.max_async_level`."""
  return ConfigDict({
      # Partial rollouts (needs algo.max_async_level >= 1): engines stay full across steps, a
      # step's batch is the first prompts_per_step groups to finish, and a generation still
      # decoding at a publish goes on under the new weights (its keys and values recomputed;
      # an episode's next turn); every token keeps its version and log-prob, and a sample
      # whose oldest token would exceed the staleness bound starts again.
      "partial": False,
  })


def checkpoint_config() -> ConfigDict:
  """orbax checkpoints in WORKDIR/checkpoints (a workdir holding one resumes from it)."""
  return ConfigDict({
      "every": 100,  # a checkpoint every N steps (and at the last one); 0 = only at the end
      "keep": 2,  # the newest N are kept, >= 1
      "async_write": True,  # write in the background while training goes on
  })


def logging_config() -> ConfigDict:
  """Where process 0 sends each metrics row (`training.trackers`) and, every `rollouts_every`
  steps (0: never), the step's completions: WORKDIR/rollouts.jsonl (`training.rollout_log`),
  and a table in each of wandb, mlflow and trackio that is on."""
  return ConfigDict({
      # any of tensorboard (WORKDIR/tb), jsonl (WORKDIR/metrics.jsonl), wandb, mlflow, trackio
      # (each its pip extra, jaxrl_llm[wandb] ...); on the command line comma-separated:
      # --config.logging.trackers=tensorboard,jsonl,wandb
      "trackers": ("tensorboard", "jsonl"),
      "project": "jaxrl_llm",  # the wandb project, MLflow experiment and trackio project
      "rollouts_every": 0,
  })


def base_config() -> ConfigDict:
  """A full config with every sub-tree; GRPO's algorithm axes."""
  config = ConfigDict()
  config.seed = 0
  config.model = model_config()
  config.lora = lora_config()
  config.teacher = teacher_config()
  config.judge = judge_config()
  config.mesh = mesh_config()
  config.sampling = sampling_config()
  config.algo = algo_config(config.sampling)
  config.optimizer = optimizer_config()
  config.train = train_config()
  config.eval = eval_config()
  config.data = data_config(config.sampling)
  config.rewards = rewards_config()
  config.rollouts = rollouts_config()
  # Mixed sources: NAME -> source_config(), in name order; empty = one source, config.data and
  # config.rewards
  config.sources = ConfigDict()
  config.checkpoint = checkpoint_config()
  config.logging = logging_config()
  return config


def shrink_for_local(config: ConfigDict) -> None:
  """`runlocal`: small enough to run a few steps on a laptop CPU."""
  config.sampling.num_samples = 4
  config.sampling.max_new_tokens = 16
  config.sampling.max_prompt_len = 32
  config.sampling.prompt_buckets = (16, 32)
  config.train.steps = 2
  config.train.prompts_per_step = 2
  config.train.micro_batch_size = 8
  config.train.eval_every = 0
  config.train.logprob_chunk_size = 8
  config.checkpoint.every = 0


def finalize(config: ConfigDict) -> ConfigDict:
  """Locks the key set: assigning an unknown key (a typo) raises."""
  config.lock()
  return config
