"""What one compiled sampling program is specialised on (`SamplingSettings`), and how a
run's `config.sampling` becomes one (`from_config`, the one place that reads it)."""
from __future__ import annotations

import dataclasses

LAYER_LOOPS = ("auto", "scan", "unrolled")
WEIGHT_LAYOUTS = ("tensor", "replicated", "training")
ENGINES = ("auto", "static", "continuous")
# 'auto' runs the continuous engine from this many new tokens per completion, by platform
# (None: never). On a CPU or GPU, below it the static batch's simpler step is faster on every
# length distribution measured (README, "Sampling engines"). On a TPU, XLA:TPU's own figures
# for the Qwen3-1.7B recipe's sampler (512 new tokens, v5e-8; `launch.compile`) give the
# static engine a roofline of 3.0 s and the continuous one 10.5 s, at a peak of 43% and 72%
# of HBM: the continuous engine gathers every slot's pages into a copy each step (3.5x the
# bytes of the pages), decodes half the requests at a time (so reads the weights twice as
# often), and with tensor parallelism one engine keeps the whole page pool on every chip.
# A paged-attention kernel would not change the choice at 128 slots (`continuous`, "Pallas
# kernels").
CONTINUOUS_FROM_NEW_TOKENS = {"cpu": 256, "gpu": 256, "tpu": None}
# 'auto' plays multi-turn episodes on the continuous engine, each admitted for its next
# turn as its own environment answers (`training.rollouts.admitted`), except on a TPU,
# where the continuous engine's step costs 3.5x the static one's (above): there the batch's
# turns go together (`sampling.TurnSampler`, the program `launch.compile` checks).
EPISODES_ON_CONTINUOUS = {"cpu": True, "gpu": True, "tpu": False}
ADAPTER_MODES = ("merged", "applied")  # how LoRA adapters decode (`SamplingSettings.adapters`)


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """Static controls of one compiled sampling program.

  `layer_loop`: how prefill and decode steps run the layers. 'scan' reads each layer's
  weights and cache out of the stacked arrays: the program holds one layer, so its compile
  time does not grow with depth. 'unrolled' unstacks the weights once per call and loops
  over layers in Python with one cache buffer per layer (`decode`), so the decode loop
  reads every buffer where it lies, but the program, and its compile time, grow with
  depth. 'auto': what the platform's row of `decode.DECODE_TUNING` says.

  `weight_layout`: where the weights live while decoding. Training shards them over `fsdp`
  (and `tensor`); a decode step that read them there would all-gather every layer's weights
  for every token. So once per call, before the decode loop, 'tensor' gathers the fsdp
  shards and keeps the tensor-parallel split (the default), 'replicated' gathers both, and
  'training' leaves them as they are.

  `engine`: 'static' decodes all B = P*G rows together until the last one ends;
  'continuous' (`continuous`) decodes in `slots` decode slots over a paged KV cache of
  `page_size`-token pages, a freed slot taking the next request. 'auto': continuous from
  `CONTINUOUS_FROM_NEW_TOKENS` new tokens, static below (static on a TPU). `slots` 0: half of the
  requests (at least one); on a data-parallel mesh the slots are split over the data
  shards' engines (`continuous.engine_slots`).

  `kv_pages`: the pages each continuous engine keeps for its completions (its prompts'
  pages are beside them), so the pool's memory; 0: every slot's worst case, `slots` x
  ceil(`max_new_tokens` / `page_size`) (also what a larger value gives). Fewer: an empty
  slot takes a request only while pages are free, and a slot that needs a page when none is
  free preempts the running request admitted last, which starts again later from its
  prompt with the same completion (`continuous`, "Fewer pages"). At least one completion's
  worst case, so the oldest running request can always grow. (The episode players'
  engine, `serving.slots`, keeps its own pages per slot.)

  `prefill_chunk`: the most columns of an episode's new tokens (its opening prompt, an
  environment's long reply) the episode players' serving engine prefills per engine step, in
  pieces between the other episodes' decode steps (`serving.Layout.prefill_chunk`; a
  multiple of `page_size`; 0: whole). Single-turn sampling prefills its prompts at once.

  `adapters`: how a policy with LoRA adapters decodes. 'merged' adds them into the kernels
  once per call, before the decode loop (an int8 base is dequantized then: the merged
  weights are in the compute dtype); 'applied' keeps the base as it is stored and runs
  every adapter beside its kernel at every step. bench/lora.py measures both.
  """
  num_samples: int
  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0
  layer_loop: str = "auto"
  weight_layout: str = "tensor"
  engine: str = "auto"
  slots: int = 0
  page_size: int = 32
  adapters: str = "merged"
  kv_pages: int = 0
  prefill_chunk: int = 0

  def __post_init__(self):
    if self.num_samples < 1:
      raise ValueError(f"num_samples={self.num_samples}: expected >= 1")
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={self.max_new_tokens}: expected >= 1")
    if self.temperature < 0:
      raise ValueError(f"temperature={self.temperature}: expected >= 0 (0 = greedy)")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k}: expected >= 0 (0 = off)")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p}: expected 0 < top_p <= 1 (1 = off)")
    if self.layer_loop not in LAYER_LOOPS:
      raise ValueError(f"layer_loop={self.layer_loop!r}: expected one of {list(LAYER_LOOPS)}")
    if self.weight_layout not in WEIGHT_LAYOUTS:
      raise ValueError(f"weight_layout={self.weight_layout!r}: expected one of "
                       f"{list(WEIGHT_LAYOUTS)}")
    if self.engine not in ENGINES:
      raise ValueError(f"engine={self.engine!r}: expected one of {list(ENGINES)}")
    if self.slots < 0:
      raise ValueError(f"slots={self.slots}: expected >= 0 (0 = half of the requests)")
    if self.adapters not in ADAPTER_MODES:
      raise ValueError(f"adapters={self.adapters!r}: expected one of {list(ADAPTER_MODES)}")
    if self.page_size < 1:
      raise ValueError(f"page_size={self.page_size}: expected >= 1")
    worst = -(-self.max_new_tokens // self.page_size)  # one completion's own pages at most
    if self.kv_pages != 0 and self.kv_pages < worst:
      raise ValueError(
          f"kv_pages={self.kv_pages}: expected 0 (every slot's worst case) or at least {worst} "
          f"(the pages of one completion of max_new_tokens={self.max_new_tokens} in pages of "
          f"page_size={self.page_size}), so that the oldest running request can always grow")
    if self.prefill_chunk < 0 or self.prefill_chunk % self.page_size:
      raise ValueError(f"prefill_chunk={self.prefill_chunk}: expected 0 (whole) or a positive "
                       f"multiple of page_size={self.page_size}")


# What a run asks an engine to do (`engine_kind`): sample a batch of completions, play
# multi-turn episodes, stream either across publishes (`rollouts.partial`), or serve
# requests that arrive at any time (agent programs' endpoint, `launch.serve`).
WORKLOADS = ("samples", "episodes", "partial_samples", "partial_episodes", "agents", "serve")


def engine_kind(settings: SamplingSettings, workload: str, where: str = "cpu") -> str:
  """The engine that runs `workload` with `settings` on platform `where` ('cpu', 'gpu' or
  'tpu': `jaxrl_llm.platform`), the one place where `engine` is decided:

  - 'static': the sampler's static batch (`sampler`), 'continuous': its paged engine
    (`continuous`), for a batch of samples; 'auto' takes the continuous one from
    `CONTINUOUS_FROM_NEW_TOKENS` new tokens (never on a TPU);
  - 'turns': a batch of episodes' turns decoded together (`turns`); 'slots': the slot
    engine that admits each request (an episode's next turn, a partial rollout's sample,
    an agent's or a client's call) as it comes (`serving`). Episodes take the slots with
    'continuous', and with 'auto' where `EPISODES_ON_CONTINUOUS` says (not on a TPU).

  Raises:
    ValueError: a workload no engine of `settings.engine` runs (episodes streamed across
      publishes need the slots), naming the setting and what would run it.
  """
  if workload not in WORKLOADS:
    raise ValueError(f"workload={workload!r}: expected one of {list(WORKLOADS)}")
  engine = settings.engine
  if workload == "samples":
    if engine != "auto":
      return engine
    threshold = CONTINUOUS_FROM_NEW_TOKENS[where]
    return ("continuous" if threshold is not None and settings.max_new_tokens >= threshold
            else "static")
  if workload in ("partial_samples", "agents", "serve"):
    return "slots"
  admitted = engine == "continuous" or (engine == "auto" and EPISODES_ON_CONTINUOUS[where])
  if workload == "partial_episodes" and not admitted:
    raise ValueError(
        f"sampling.engine={engine!r} on {where} plays episodes turn by turn in lockstep "
        "(sampling.turns), and episodes that span publishes (rollouts.partial) need each turn "
        "admitted as its environment answers: expected sampling.engine='continuous'")
  return "slots" if admitted else "turns"


def from_config(cfg, eos_ids: tuple[int, ...], pad_id: int,
                greedy: bool = False) -> SamplingSettings:
  """The sampler's settings from `config.sampling` (`cfg`); `greedy`: one temperature-0
  sample per prompt (held-out evaluation)."""
  engine = dict(layer_loop=cfg.layer_loop, weight_layout=cfg.weight_layout, engine=cfg.engine,
                slots=cfg.slots, page_size=cfg.page_size, adapters=cfg.adapters,
                kv_pages=cfg.kv_pages, prefill_chunk=cfg.prefill_chunk)
  if greedy:
    return SamplingSettings(1, cfg.max_new_tokens, 0.0, 0, 1.0, eos_ids, pad_id, **engine)
  return SamplingSettings(cfg.num_samples, cfg.max_new_tokens, cfg.temperature, cfg.top_k,
                          cfg.top_p, eos_ids, pad_id, **engine)


def turn_settings(settings: SamplingSettings, end_of_turn: int) -> SamplingSettings:
  """`settings` whose stop tokens include a chat template's end-of-turn token (one model
  turn of an episode)."""
  return dataclasses.replace(settings, eos_ids=tuple(sorted({end_of_turn, *settings.eos_ids})))


def eos_ids(tokenizer, model_config) -> tuple[int, ...]:
  """Stop ids: the tokenizer's EOS and the model config's eos_token_id(s)."""
  ids = set()
  if tokenizer.eos_token_id is not None:
    ids.add(int(tokenizer.eos_token_id))
  eos = model_config.eos_token_id
  ids.update(int(e) for e in (eos if isinstance(eos, tuple) else (eos,)) if e is not None)
  return tuple(sorted(ids))


def pad_id(tokenizer) -> int:
  """The id rows are padded with: the tokenizer's pad token, else its EOS, else 0."""
  for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
    if tid is not None:
      return int(tid)
  return 0
