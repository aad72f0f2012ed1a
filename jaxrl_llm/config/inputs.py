"""`check_inputs(config)`: the data a run reads, opened and checked before any model loads.

The training split (and the eval split when the run evaluates) is loaded as the trainer
loads it, which reads and checks a JSONL file whole (a missing file, malformed JSON, a
record without a string `prompt`, an empty file; for SFT a `completion`), and the first
`PROMPTS_CHECKED` prompts of each split are tokenized as the trainer will (chat
template, `data.max_prompt_len`, `data.prompt_overflow`), and every field their reward
functions read is checked in them (`reward_checks.check_fields`). A failure is a
`ConfigError` naming the source, the record and what was expected. The trainer's own loading stays
the final word: a later record that breaks a rule still stops the run when it is met.
"""
from __future__ import annotations

from jaxrl_llm import data, import_path
from jaxrl_llm.config import reward_checks
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.config.errors import ConfigError

PROMPTS_CHECKED = 256  # per split: enough to meet a template or length problem early


def check_inputs(config) -> None:
  """Raises `ConfigError` for data the run could not train on (see the module docstring)."""
  splits = ["train"] + (["eval"] if config.train.eval_every > 0 else [])
  try:
    tokenizer = data.run_tokenizer(config.model)
    for source in sources_lib.run_sources(config):
      d = config.data if not source.name else sources_lib.data_config(config, source)
      field = "config.data.source" if not source.name else f"config.sources.{source.name}.data"
      for split in splits:
        load = (data.load_demonstrations if d.completions == "dataset" and split == "train"
                else data.load_dataset)
        records = load(d, split, task_options=d.task_options)
        first = [records[i] for i in range(min(len(records), PROMPTS_CHECKED))]
        for i, record in enumerate(first):
          if not isinstance(record.get("prompt"), str):
            raise ValueError(f"{field}={d.source!r} (split {split!r}): record {i} has "
                             f"no string 'prompt' field (fields: {sorted(record)})")
        if d.completions == "sample" or split == "eval":  # what the functions score
          reward_checks.check_fields(source, first, f"{field}={d.source!r} (split {split!r})")
        tok = data.tokenize_prompts(tokenizer, [r["prompt"] for r in first], d,
                                    config.sampling.prompt_buckets,
                                    indices=list(range(len(first))))
        hint = source.algo.distill
        if split == "train" and hint.teacher == "self" and (hint.coef or hint.shaping_coef):
          try:
            data.hinted_prompts(tokenizer, first, tok.token_lists,
                                [data.Hint(hint.hint_field, hint.hint_template)] * len(first),
                                tok.tokens.shape[1], hint.max_hint_len, 0)
          except ValueError as e:
            raise ValueError(f"{field}={d.source!r} (split 'train'): {e}") from e
      if source.multi_turn:
        check_environment(source, tokenizer, first_record=first[0] if first else None)
    check_teacher_tokenizer(config, tokenizer)
  except (ValueError, OSError, ImportError) as e:
    raise ConfigError("; ".join(str(e).splitlines())) from e


def check_environment(source, tokenizer, first_record=None) -> None:
  """A multi-turn source's environment builds, the tokenizer's chat template renders its
  episodes token-exactly (`envs.ChatRenderer.check_template`: else one line, exit 2), and
  its opening for the first record fits `max_episode_tokens`."""
  from jaxrl_llm import envs  # pylint: disable=g-import-not-at-top
  if source.env.get("agent"):  # an agent program: its calls are rendered by the template
    try:
      envs.ChatRenderer(tokenizer)
    except envs.TemplateError as e:
      raise ValueError(f"{source.field}.agent={source.env['agent']!r}: {e}") from e
    return
  field = f"{source.field}.env={source.env['env']!r}"
  env = None
  try:
    import_path.load_function(source.env["env"], field=f"{source.field}.env")
    env = envs.environment_for(source.env)
    renderer = envs.renderer_for(tokenizer, env)
    if first_record is not None:
      opening = envs.as_messages(envs.call_env(env, "reset", dict(first_record),
                                               where=f"{field}, record 0"), f"{field}, record 0")
      n = len(renderer.prompt_ids(opening))
      if n >= source.env["max_episode_tokens"]:
        raise ValueError(f"{field}: the opening of record 0 is {n} tokens, which leaves none "
                         f"for the model within {source.field}.max_episode_tokens="
                         f"{source.env['max_episode_tokens']}: expected more than {n}")
  except envs.TemplateError as e:
    raise ValueError(f"{field}: {e}") from e
  except envs.EnvError as e:
    raise ValueError(str(e)) from e
  finally:
    if env is not None:
      envs.loading.close(env)


def check_teacher_tokenizer(config, tokenizer) -> None:
  """A teacher (`config.teacher.path`) must map every token of the policy's tokenizer to the
  same id (distillation compares the log-probs of the same ids), and its embedding must
  cover them; a teacher with more tokens or a larger padded embedding is fine."""
  from jaxrl_llm.models import load as model_load  # pylint: disable=g-import-not-at-top

  path = config.teacher.path
  if not path:
    return
  try:
    teacher = data.load_tokenizer(path)
  except (OSError, ValueError) as e:
    raise ValueError(f"config.teacher.path={path!r} has no tokenizer the policy's can be "
                     f"compared with: {e}") from e
  mine, theirs = tokenizer.get_vocab(), teacher.get_vocab()
  differ = sorted((t for t in mine if theirs.get(t) != mine[t]), key=mine.get)
  if differ:
    t = differ[0]
    raise ValueError(f"config.teacher.path={path!r}: its tokenizer maps {len(differ)} of the "
                     f"policy's {len(mine)} tokens to other ids (e.g. {t!r}: {mine[t]} in the "
                     f"policy's, {theirs.get(t)} in the teacher's): expected the policy's "
                     "tokenizer")
  vocab_size = model_load.read_config(path)["vocab_size"]
  if vocab_size < len(mine):
    raise ValueError(f"config.teacher.path={path!r}: vocab_size {vocab_size} in its config.json "
                     f"is smaller than the policy's tokenizer ({len(mine)} tokens): expected "
                     f">= {len(mine)}")
