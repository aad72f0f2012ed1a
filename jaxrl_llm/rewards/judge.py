"""Reward models and LLM judges (`config.judge`): a frozen Hugging Face model that scores
completions, as a reward function like any other (`reward/judge`, weight `judge.weight`).

Two kinds:
  classifier  a sequence-classification reward model (`*ForSequenceClassification` with one
              label, e.g. Skywork-Reward-style Llama/Qwen): its score head read at the last
              token of the prompt and completion is the reward. With `judge.chat` and a
              tokenizer that has a chat template, the text is the conversation [user: prompt,
              assistant: completion] as its template renders it, as such models are trained;
              else the prompt followed by the completion.
  generative  a causal LM asked `judge.template` (its `{prompt}`, `{completion}` and the
              record's fields filled in; a user turn of its chat template with `judge.chat`),
              answering greedily in up to `judge.max_new_tokens` tokens; `judge.parser` turns
              the verdict into a score: a regex whose first group is a number, or a function
              "pkg.module:fn" (verdict text -> float or None). A verdict it finds no score in
              scores `judge.unparsed`.

The judge has its own tokenizer: it reads text, so it may differ from the policy's. A text
longer than `judge.max_len` tokens keeps its last `max_len` (the completion's end). The
judge runs on this process's devices (a mesh of `jax.local_devices()`, FSDP over them with
the run's logical rules), in the compute dtype, `batch_size` texts per program and lengths
bucketed to powers of two: each process scores its own rows without waiting for another,
so the asynchronous pipeline's order of programs that span processes is not involved.

A run's set-up builds one `Judge` per process (given the judge checkpoint's architecture in
the run's numerics) and hands it to what scores: the sources name the placeholder `judge`
(`JUDGE_FUNCTION`, added by `config.sources`), and a reward set built with the judge
(`reward_checks.reward_set(source, judge)`) scores with its `reward` in that place. Its
`flops` counts its model FLOPs so far (`models.flops`; training adds them to a step's).
Nothing is kept at module level: two judges in one process share nothing.
"""
from __future__ import annotations

import re
import string

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import import_path, models, sampling
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import flops as flops_lib
from jaxrl_llm.models import load as load_lib

MIN_BUCKET = 16


def judge(prompts, completions, **fields) -> np.ndarray:
  """The reward function the sources name for `config.judge` (`JUDGE_FUNCTION`): a
  placeholder, which a reward set built with the run's `Judge` replaces by its `reward`."""
  raise RuntimeError("config.judge.path is set but this reward set has no judge: build it "
                     "with reward_checks.reward_set(source, judge), the Judge of the run's "
                     "set-up (training.setup.load_judge(config))")


class Judge:
  """`config.judge`'s model, tokenizer and settings (module docstring).

  Args:
    config: the run's config (`judge`, the compute dtype, the mesh's logical rules).
    model_config: the judge checkpoint's architecture in the run's numerics (training's
      `setup.model_config(config.model, config.judge.path)`).
  """

  def __init__(self, config, model_config: models.ModelConfig):
    from jaxrl_llm import data  # pylint: disable=g-import-not-at-top
    cfg = self.cfg = config.judge
    self.tokenizer = data.load_tokenizer(cfg.path)
    mcfg = model_config
    if cfg.kind == "classifier":
      mcfg = mcfg.replace(head="value")
    mesh = sh.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, jax.local_devices())
    rules = sh.freeze_rules(config.mesh.rules)
    self.model = models.frozen(models.place(
        models.Model(load_lib.load_params(cfg.path, mcfg), mcfg), mesh, rules))
    self.rows = -(-cfg.batch_size // mesh.size) * mesh.size
    self.flops = 0.0
    self.parse = None if cfg.kind == "classifier" else verdict_parser(cfg.parser)
    if cfg.kind == "classifier":
      self._values = models.compute_values  # a jitted forward
    else:
      pad = sampling.pad_id(self.tokenizer)
      eos = sampling.eos_ids(self.tokenizer, mcfg)
      self.settings = sampling.SamplingSettings(1, cfg.max_new_tokens, 0.0, 0, 1.0, eos, pad)
      self.sampler = sampling.Sampler(self.settings, buckets(cfg.max_len - cfg.max_new_tokens))

  def reward(self, prompts, completions, **fields) -> np.ndarray:
    """The judge's scores as a reward function (what `judge` stands for in a reward set)."""
    return self(list(prompts), list(completions), fields)

  def __call__(self, prompts: list[str], completions: list[str], fields: dict) -> np.ndarray:
    if self.cfg.kind == "classifier":
      texts = [self.conversation(p, c) for p, c in zip(prompts, completions)]
      return self.classify(texts)
    asks = [self.question(p, c, {k: v[i] for k, v in fields.items()})
            for i, (p, c) in enumerate(zip(prompts, completions))]
    verdicts = self.generate(asks)
    scores = [self.parse(v) for v in verdicts]
    return np.asarray([self.cfg.unparsed if s is None else s for s in scores], np.float32)

  # --- text -> ids ---------------------------------------------------------------------------
  def _chat(self) -> bool:
    return bool(self.cfg.chat and getattr(self.tokenizer, "chat_template", None))

  def conversation(self, prompt: str, completion: str) -> list[int]:
    """A classifier's ids of prompt and completion (module docstring), the last max_len."""
    if self._chat():
      ids = self.tokenizer.apply_chat_template(
          [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
          tokenize=True)
    else:
      ids = self.tokenizer(prompt + completion)["input_ids"]
    return list(ids)[-self.cfg.max_len:]

  def question(self, prompt: str, completion: str, record: dict) -> list[int]:
    """A generative judge's prompt ids: the template filled in (module docstring)."""
    text = string.Formatter().vformat(self.cfg.template, (),
                                      {**record, "prompt": prompt, "completion": completion})
    if self._chat():
      ids = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                               tokenize=True, add_generation_prompt=True)
    else:
      ids = self.tokenizer(text)["input_ids"]
    return list(ids)[-(self.cfg.max_len - self.cfg.max_new_tokens):]

  # --- the programs ---------------------------------------------------------------------------
  def classify(self, texts: list[list[int]]) -> np.ndarray:
    """Score heads at each text's last token, `rows` texts per program."""
    out = []
    pad = sampling.pad_id(self.tokenizer)
    for start in range(0, len(texts), self.rows):
      chunk = texts[start:start + self.rows]
      width = bucket(max(len(t) for t in chunk), self.cfg.max_len)
      ids = np.full((self.rows, width), pad, np.int32)
      mask = np.zeros((self.rows, width), np.int32)
      for i, t in enumerate(chunk):  # left-padded: every text ends at the last column
        ids[i, width - len(t):], mask[i, width - len(t):] = t, 1
      values = self._values(self.model, jnp.asarray(ids), jnp.asarray(mask))
      out.append(np.asarray(values[:len(chunk), -1], np.float32))
      self.flops += flops_lib.forward_flops(self.model.config, float(mask.sum()),
                                   float(mask[:len(chunk)].sum(axis=1).mean()) / 2, 0.0)
    return np.concatenate(out) if out else np.zeros(0, np.float32)

  def generate(self, asks: list[list[int]]) -> list[str]:
    """Greedy verdicts, `rows` questions per program."""
    verdicts = []
    for start in range(0, len(asks), self.rows):
      chunk = asks[start:start + self.rows]
      chunk = chunk + [chunk[-1]] * (self.rows - len(chunk))  # a fixed number of rows
      out = self.sampler.sample_local(self.model, chunk, 0)
      n = min(self.rows, len(asks) - start)
      verdicts += [self.tokenizer.decode(out.tokens[i, :out.lengths[i]], skip_special_tokens=True)
                   for i in range(n)]
      made = float(np.sum(out.lengths))
      prompt_tokens = float(sum(len(a) for a in chunk))
      self.flops += flops_lib.forward_flops(self.model.config, prompt_tokens + made,
                                   (prompt_tokens + made) / len(chunk) / 2, made)
    return verdicts


def verdict_parser(spec: str):
  """A verdict text -> float or None: "pkg.module:fn", else a regex whose first group (or
  whole match) is a number, the last match counting."""
  if re.fullmatch(r"[\w.]+:\w+", spec):
    return import_path.load_function(spec, field="config.judge.parser")
  pattern = re.compile(spec)

  def parse(text: str):
    found = pattern.findall(text)
    if not found:
      return None
    last = found[-1]
    last = last[0] if isinstance(last, tuple) else last
    try:
      return float(last)
    except ValueError:
      return None
  return parse


def bucket(length: int, cap: int) -> int:
  """The power of two (at least MIN_BUCKET) a text of `length` tokens is padded to, at most
  `cap`."""
  return min(max(MIN_BUCKET, 1 << max(length - 1, 0).bit_length()), cap)


def buckets(cap: int) -> tuple[int, ...]:
  """Every `bucket` up to `cap`: a generative judge's prompt lengths."""
  out, b = [], MIN_BUCKET
  while b < cap:
    out.append(b)
    b *= 2
  return tuple(out) + (cap,)
