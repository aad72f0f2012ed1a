"""Rollouts: prompts -> completions -> rewards, on the host, with DAPO's dynamic sampling.

Two sources of completions, chosen by `config.data.completions`:
  'sample':  the policy samples G completions per prompt (RL);
  'dataset': each record's `completion` field is the target (SFT, demonstrations).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator, Sequence

import jax
import numpy as np

from jaxrl_llm import data, distributed, objectives, sampling
from jaxrl_llm.rewards import Rewards, RewardSet

@dataclasses.dataclass
class Rollout:
  """One RL step's batch on the host, prompt-major (B = P * G rows).

  Attributes:
    prompt_tokens, prompt_mask: int32 [P, S0], left-padded prompts.
    tokens, mask: int32 [B, N], completions (mask: generated tokens up to EOS).
    logprobs: float32 [B, N] behaviour log-probs from the sampler (None for 'dataset').
    lengths: int32 [B]; truncated: bool [B] (no EOS within N tokens).
    rewards: float32 [B], the rewards advantages are computed from (overlong-shaped).
    group_valid: bool [P]; False for filler groups (dynamic sampling) that carry no loss.
    metrics: host scalars about this rollout (reward means, rounds, ...): filled in from
      `stats` by the source's `summarize`, on the trainer's thread.
    stats: this process's rows of what the metrics describe (`summarize` gathers every
      process's, the one collective of a rollout after its sampling).
    position: the data position after this rollout (a checkpoint stores it).
    prompts, completions: the texts, for logging.
    step, policy_version: with asynchronous rollouts (`async_rollouts`), the step this
      rollout is for and the policy version (updates done) that sampled it; else None.
    sources: int32 [P], each prompt's source in a mixed run (`config.sources`), else None.
    hint_tokens, hint_mask: int32 [P, S0 + H], each prompt after its hint block
      (self-distillation, `data.hints`; a prompt of a source without one, alone), else None.
    source_positions: a mixed run's items taken from each source (a checkpoint stores
      them), else None.
    attention: int32 [B, N], the completion tokens attended to when they differ from
      `mask` (multi-turn episodes: the environment's tokens too; `training.episodes`),
      else None.
    echo_weights: float32 [B, N], echo's weight of each environment token
      (`config.algo.echo`), else None; turn_rewards: float32 [B, N], each model turn's
      step reward on its last token (episodes), else None.
    episodes: each row's `envs.Episode.as_row()` (episodes), for rollouts.jsonl, else None.
    routing: int32 [B, S0 + N, MoE layers, k], the experts an MoE policy's sampler routed
      each prompt and completion token to (-1: none recorded; `sampling.SampleOutput`),
      else None.
  """
  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  tokens: np.ndarray
  mask: np.ndarray
  logprobs: np.ndarray | None
  lengths: np.ndarray
  truncated: np.ndarray
  rewards: np.ndarray
  group_valid: np.ndarray
  metrics: dict
  position: int
  prompts: list[str]
  completions: list[str]
  step: int | None = None
  policy_version: int | None = None
  sources: np.ndarray | None = None
  source_positions: dict[str, int] | None = None
  hint_tokens: np.ndarray | None = None
  hint_mask: np.ndarray | None = None
  stats: dict = dataclasses.field(default_factory=dict)
  attention: np.ndarray | None = None
  echo_weights: np.ndarray | None = None
  turn_rewards: np.ndarray | None = None
  episodes: list[dict] | None = None
  routing: np.ndarray | None = None


def eos_ids(tokenizer, model_config) -> tuple[int, ...]:
  """Stop ids: the tokenizer's EOS and the model config's eos_token_id(s)."""
  ids = set()
  if tokenizer.eos_token_id is not None:
    ids.add(int(tokenizer.eos_token_id))
  eos = model_config.eos_token_id
  ids.update(int(e) for e in (eos if isinstance(eos, tuple) else (eos,)) if e is not None)
  return tuple(sorted(ids))


def pad_id(tokenizer) -> int:
  for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
    if tid is not None:
      return int(tid)
  return 0


def sampling_settings(s, eos, pad, greedy: bool = False) -> sampling.SamplingSettings:
  """The sampler's settings from `config.sampling` (`s`; greedy: one temperature-0 sample)."""
  engine = dict(layer_loop=s.layer_loop, weight_layout=s.weight_layout, engine=s.engine,
                slots=s.slots, page_size=s.page_size, adapters=s.adapters)
  if greedy:
    return sampling.SamplingSettings(1, s.max_new_tokens, 0.0, 0, 1.0, eos, pad, **engine)
  return sampling.SamplingSettings(s.num_samples, s.max_new_tokens, s.temperature, s.top_k,
                                   s.top_p, eos, pad, **engine)


def decode_completions(tokenizer, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
  """Each row's first `length` tokens as text, special tokens (EOS) dropped."""
  return tokenizer.batch_decode([row[:n].tolist() for row, n in zip(tokens, lengths)],
                                skip_special_tokens=True)


def prompt_aligned_routing(routing: np.ndarray, prompt_len: int, N: int) -> np.ndarray:
  """A sampler's routing [B, S + N, ...] for prompts of `prompt_len` columns: columns of
  left padding dropped, or -1 (nothing recorded) added on the left."""
  extra = prompt_len - (routing.shape[1] - N)
  if extra <= 0:
    return routing[:, -extra:]
  return np.pad(routing, ((0, 0), (extra, 0), (0, 0), (0, 0)), constant_values=-1)


def _repad(arrays: list[np.ndarray], masks: list[np.ndarray], pad: int):
  """Left-pads prompt blocks of different bucket lengths to the longest."""
  S0 = max(a.shape[1] for a in arrays)
  out_t, out_m = [], []
  for a, m in zip(arrays, masks):
    extra = S0 - a.shape[1]
    out_t.append(np.pad(a, ((0, 0), (extra, 0)), constant_values=pad))
    out_m.append(np.pad(m, ((0, 0), (extra, 0))))
  return np.concatenate(out_t), np.concatenate(out_m)


class SampledRollouts:
  """RL rollouts: sample G completions per prompt, score them, keep informative groups.

  `reward_sets`: one per source, in the run's source order; `source_names`: the sources of
  a mixed run (`config.sources`; their batches carry each record's source), () for one;
  `hints`: per source, its self-distillation hint (`data.Hint`) or None.
  """

  def __init__(self, config, tokenizer, batches: Iterator[data.RecordBatch],
               sampler: sampling.Sampler, reward_sets: Sequence[RewardSet],
               source_names: Sequence[str] = (), hints: Sequence[data.Hint | None] = ()):
    self.config = config
    self.tokenizer = tokenizer
    self.batches = batches
    self.sampler = sampler
    self.reward_sets = list(reward_sets)
    self.source_names = tuple(source_names)
    self.hints = list(hints) if any(hints) else []
    self.G = config.sampling.num_samples
    self.pad = pad_id(tokenizer)

  def _hinted(self, batch: data.RecordBatch, tok):
    """(tokens, mask) of every prompt after its source's hint, or None without hints."""
    if not self.hints:
      return None
    sources = batch.sources if batch.sources is not None else np.zeros(len(batch.records), int)
    return data.hinted_prompts(self.tokenizer, batch.records, tok.token_lists,
                               [self.hints[s] for s in sources], tok.tokens.shape[1],
                               self.config.algo.distill.max_hint_len, self.pad,
                               indices=batch.indices)

  def _score(self, batch: data.RecordBatch, prompts: list[str], completions: list[str],
             extra: dict[str, list] | None = None):
    """The rewards of a batch's completions, each row by its own source's functions
    (named `SOURCE/FUNCTION` in a mixed run, NaN on the other sources' rows); `extra`:
    more fields, one value per row (an episode's `turns` and `messages`)."""
    G, extra = self.G, extra or {}
    if batch.sources is None:
      return self.reward_sets[0](prompts, completions, **batch.fields(repeat=G), **extra)
    total = np.zeros(len(prompts), np.float32)
    per_function = {f"{name}/{fn}": np.full(len(prompts), np.nan, np.float32)
                    for name, rs in zip(self.source_names, self.reward_sets) for fn in rs.names}
    rows_source = np.repeat(batch.sources, G)
    for i, (name, reward_set) in enumerate(zip(self.source_names, self.reward_sets)):
      rows = np.flatnonzero(rows_source == i)
      if rows.size:
        scored = reward_set([prompts[r] for r in rows], [completions[r] for r in rows],
                            **batch.subset(batch.sources == i).fields(repeat=G),
                            **{k: [v[r] for r in rows] for k, v in extra.items()})
        total[rows] = scored.total
        for fn, values in scored.per_function.items():
          per_function[f"{name}/{fn}"][rows] = values
    return Rewards(total, per_function)

  def __call__(self, policy, key: jax.Array) -> Rollout:
    return self.start(policy, key).finish()

  def start(self, policy, key: jax.Array) -> "PendingRollout":
    """Issues the rollout's sampling; `.finish()` on the result completes it.

    Everything that every process must do together (agreeing on the prompt bucket, the
    sampling programs, dynamic sampling's "enough informative groups?") happens here, in
    the same order on every process; `finish` reads this process's rows, decodes and
    scores them with no collective, so it may overlap another thread's programs.
    """
    algo = self.config.algo
    rounds = algo.dynamic_sampling.max_rounds if algo.dynamic_sampling.enabled else 1
    pending = PendingRollout(self)
    for r in range(rounds):
      batch = next(self.batches)
      tok = data.tokenize_prompts(self.tokenizer, batch.prompts, self.config.data,
                                  self.config.sampling.prompt_buckets, indices=batch.indices)
      out = self.sampler(policy, tok.token_lists, jax.random.fold_in(key, r))
      pending.blocks.append(dict(batch=batch, tok=tok, out=out))
      if not algo.dynamic_sampling.enabled:
        break
      # Every process samples the same number of rounds: until all have P informative groups.
      if distributed.all_true(pending.score_all() >= len(batch.records)):
        break
    return pending

  def _score_block(self, block: dict) -> float:
    """Reads a block's rows here, decodes and scores them; returns the seconds scoring took."""
    batch, G = block["batch"], self.G
    block["out"] = distributed.local_rows(block["out"])
    prompts = [p for p in batch.prompts for _ in range(G)]
    t0 = time.perf_counter()
    completions = decode_completions(self.tokenizer, block["out"].tokens, block["out"].lengths)
    scored = self._score(batch, prompts, completions)
    seconds = time.perf_counter() - t0
    P = len(batch.records)
    informative = np.asarray(objectives.dynamic_sampling_keep(scored.total.reshape(P, G)))
    block.update(scored=scored, prompts=prompts, completions=completions,
                 informative=informative, sources=batch.sources,
                 source_positions=batch.source_positions, hint=self._hinted(batch, block["tok"]))
    return seconds

  def _assemble(self, blocks, position, truncated_prompts, rounds) -> Rollout:
    """The first P groups, informative ones first when dynamic sampling is on; `stats` for
    `summarize` (this process's rows, not yet gathered)."""
    G, algo = self.G, self.config.algo
    P = len(blocks[0]["tok"].token_lists)
    order = [(b, p) for b, blk in enumerate(blocks) for p in range(P)]
    if algo.dynamic_sampling.enabled:
      order.sort(key=lambda bp: not blocks[bp[0]]["informative"][bp[1]])  # stable
    chosen = order[:P]
    rows = lambda b, p: slice(p * G, (p + 1) * G)
    take = lambda f: np.concatenate([f(blocks[b])[rows(b, p)] for b, p in chosen])
    prompt_tokens, prompt_mask = _repad(
        [blocks[b]["tok"].tokens[p:p + 1] for b, p in chosen],
        [blocks[b]["tok"].mask[p:p + 1] for b, p in chosen], self.pad)
    total = take(lambda blk: blk["scored"].total)
    lengths = take(lambda blk: blk["out"].lengths)
    truncated = take(lambda blk: blk["out"].truncated)
    shaped = np.asarray(objectives.overlong_shaped_rewards(total, lengths, algo.overlong))
    group_valid = np.array([bool(blocks[b]["informative"][p]) or not algo.dynamic_sampling.enabled
                            for b, p in chosen])
    per_function = {name: take(lambda blk, n=name: blk["scored"].per_function[n])
                    for name in blocks[0]["scored"].per_function}
    sources = (None if blocks[0]["sources"] is None
               else np.array([blocks[b]["sources"][p] for b, p in chosen], np.int32))
    hint_tokens = hint_mask = None
    if blocks[0]["hint"] is not None:
      hint_tokens, hint_mask = _repad([blocks[b]["hint"][0][p:p + 1] for b, p in chosen],
                                      [blocks[b]["hint"][1][p:p + 1] for b, p in chosen], self.pad)
    stats = dict(
        per_function=per_function, total=total, lengths=lengths, truncated=truncated,
        group_valid=group_valid, shaped=shaped, truncated_prompts=np.asarray([truncated_prompts]),
        informative=np.concatenate([b["informative"] for b in blocks]),
        sources=np.repeat(sources if sources is not None else np.zeros(len(chosen), np.int32),
                          G), rounds=np.asarray([rounds]))
    routing = None
    if blocks[0]["out"].routing is not None:
      N = blocks[0]["out"].tokens.shape[1]
      aligned = [prompt_aligned_routing(blk["out"].routing, prompt_tokens.shape[1], N)
                 for blk in blocks]
      routing = np.concatenate([aligned[b][rows(b, p)] for b, p in chosen])
    return Rollout(
        prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, routing=routing,
        tokens=take(lambda blk: blk["out"].tokens), mask=take(lambda blk: blk["out"].mask),
        logprobs=take(lambda blk: blk["out"].logprobs), lengths=lengths, truncated=truncated,
        rewards=shaped.astype(np.float32), group_valid=group_valid, metrics={},
        position=position, prompts=[blocks[b]["prompts"][p * G] for b, p in chosen],
        completions=take_list([blocks[b]["completions"][rows(b, p)] for b, p in chosen]),
        sources=sources, hint_tokens=hint_tokens, hint_mask=hint_mask, stats=stats)

  def summarize(self, rollout: Rollout) -> dict[str, float]:
    """The metrics of the global batch, from every process's `rollout.stats` (one
    collective: call it where the trainer's programs are issued)."""
    algo, every = self.config.algo, distributed.concat(rollout.stats)
    if rollout.sources is None:
      metrics = {f"reward/{k}": float(v.mean()) for k, v in every["per_function"].items()}
    else:
      metrics = self._source_metrics(every)
    metrics.update(
        reward_mean=float(every["total"].mean()), reward_std=float(every["total"].std()),
        zero_variance_group_frac=float(np.mean(~every["informative"])),
        response_length_mean=float(every["lengths"].mean()),
        truncated_frac=float(every["truncated"].mean()),
        prompts_truncated=float(every["truncated_prompts"].sum()))
    if algo.dynamic_sampling.enabled:
      metrics.update(dynamic_sampling_rounds=float(every["rounds"][0]),
                     dynamic_sampling_filler_frac=float(1 - every["group_valid"].mean()))
    if algo.overlong.enabled:
      metrics["reward_shaped_mean"] = float(every["shaped"].mean())
    return metrics

  def _source_metrics(self, every) -> dict[str, float]:
    """A mixed batch's metrics per source: `rows/NAME`, `reward_mean/NAME`,
    `response_length_mean/NAME`, `truncated_frac/NAME` and `reward/NAME/FUNCTION` (means
    over that source's rows of every process; only `rows/NAME` when it has none)."""
    metrics = {}
    for i, name in enumerate(self.source_names):
      rows = every["sources"] == i
      metrics[f"rows/{name}"] = float(rows.sum())
      if not rows.any():
        continue
      metrics[f"reward_mean/{name}"] = float(every["total"][rows].mean())
      metrics[f"response_length_mean/{name}"] = float(every["lengths"][rows].mean())
      metrics[f"truncated_frac/{name}"] = float(every["truncated"][rows].mean())
      for key, values in every["per_function"].items():
        if key.startswith(f"{name}/"):
          metrics[f"reward/{key}"] = float(values[rows].mean())
    return metrics


class PendingRollout:
  """A rollout whose sampling is issued (`SampledRollouts.start`); `finish()` completes it."""

  def __init__(self, source: SampledRollouts):
    self.source, self.blocks, self.reward_time = source, [], 0.0

  def score_all(self) -> int:
    """Scores the blocks not yet scored; returns the informative groups so far."""
    for block in self.blocks:
      if "scored" not in block:
        self.reward_time += self.source._score_block(block)
    return sum(int(b["informative"].sum()) for b in self.blocks)

  def finish(self) -> Rollout:
    """The rollout: this process's rows of the last round read and scored, the batch
    assembled (no collective)."""
    self.score_all()
    blocks = self.blocks
    truncated_prompts = sum(b["tok"].num_truncated for b in blocks)
    rollout = self.source._assemble(blocks, blocks[-1]["batch"].position + 1, truncated_prompts,
                                    len(blocks))
    rollout.source_positions = blocks[-1]["source_positions"]
    rollout.metrics["reward_time_s"] = self.reward_time
    return rollout


def take_list(parts: list[list]) -> list:
  return [x for part in parts for x in part]


class DatasetRollouts:
  """SFT: the target completion of each record, tokenised and ended with EOS."""

  def __init__(self, config, tokenizer, batches: Iterator[data.RecordBatch], eos: tuple[int, ...]):
    self.config, self.tokenizer, self.batches = config, tokenizer, batches
    self.eos, self.pad = eos, pad_id(tokenizer)

  def __call__(self, policy, key: jax.Array) -> Rollout:
    return self.start(policy, key).finish()

  def start(self, policy, key: jax.Array) -> "Ready":
    """The rollout (nothing to sample), behind the interface `SampledRollouts.start` has."""
    del policy, key
    batch = next(self.batches)
    N = self.config.sampling.max_new_tokens
    tok = data.tokenize_prompts(self.tokenizer, batch.prompts, self.config.data,
                                self.config.sampling.prompt_buckets, indices=batch.indices)
    P = len(batch.records)
    tokens = np.full((P, N), self.pad, np.int32)
    lengths = np.zeros(P, np.int32)
    truncated = np.zeros(P, bool)
    for i, record in enumerate(batch.records):
      if not isinstance(record.get("completion"), str):
        raise ValueError(f"record {int(batch.indices[i])} has no string 'completion' field, which "
                         "config.data.completions='dataset' needs")
      ids = self.tokenizer.encode(record["completion"], add_special_tokens=False)
      ids = ids + list(self.eos[:1])
      truncated[i] = len(ids) > N
      ids = ids[:N]
      tokens[i, :len(ids)] = ids
      lengths[i] = len(ids)
    mask = (np.arange(N)[None, :] < lengths[:, None]).astype(np.int32)
    return Ready(Rollout(
        prompt_tokens=tok.tokens, prompt_mask=tok.mask, tokens=tokens, mask=mask, logprobs=None,
        lengths=lengths, truncated=truncated, rewards=np.ones(P, np.float32),
        group_valid=np.ones(P, bool), metrics={}, position=batch.position + 1,
        prompts=batch.prompts, completions=[r["completion"] for r in batch.records],
        stats=dict(lengths=lengths, truncated=truncated,
                   truncated_prompts=np.asarray([tok.num_truncated]))))

  def summarize(self, rollout: Rollout) -> dict[str, float]:
    """The metrics of the global batch (one collective, as `SampledRollouts.summarize`)."""
    every = distributed.concat(rollout.stats)
    return dict(response_length_mean=float(every["lengths"].mean()),
                truncated_frac=float(every["truncated"].mean()),
                prompts_truncated=float(every["truncated_prompts"].sum()))


@dataclasses.dataclass
class Ready:
  """A rollout with nothing left to do (`finish` returns it)."""
  rollout: Rollout

  def finish(self) -> Rollout:
    return self.rollout
