"""Prompt data: sources, resumable batches, tokenisation.

  from jaxrl_llm import data
  dataset = data.load_dataset(config.data, 'train')               # len + indexing
  for batch in data.prompt_batches(dataset, P, seed=config.data.shuffle_seed,
                                   start=position, process_index=jax.process_index(),
                                   process_count=jax.process_count()):
    tok = data.tokenize_prompts(tokenizer, batch.prompts, config.data,
                                config.sampling.prompt_buckets, indices=batch.indices)
    # tok.tokens / tok.mask: int32 [b, S]; tok.token_lists for the sampler;
    # batch.fields(repeat=G): the reward functions' keyword arguments, aligned with
    # the G completions per prompt; a checkpoint stores batch.position + 1.

Modules: `sources` (`task:` / `jsonl:` / `tfds:` -> dataset), `jsonl`,
`tfds_source`, `batching` (order, resumption, per-process slices), `mixing` (several
sources in each batch), `hints` (self-distillation's hinted prompts), `prompts`
(template, encode, overflow, bucket padding), `char_tokenizer` (the demo's
printable-ASCII tokenizer).
"""
from jaxrl_llm.data.batching import RecordBatch
from jaxrl_llm.data.batching import batch_indices
from jaxrl_llm.data.batching import prompt_batches
from jaxrl_llm.data.batching import sequential_batches
from jaxrl_llm.data.hints import Hint
from jaxrl_llm.data.hints import hinted_prompts
from jaxrl_llm.data.mixing import mix_counts
from jaxrl_llm.data.mixing import mixed_batches
from jaxrl_llm.data.prompts import PromptFormat
from jaxrl_llm.data.prompts import TokenizedPrompts
from jaxrl_llm.data.prompts import encode_prompts
from jaxrl_llm.data.prompts import load_tokenizer
from jaxrl_llm.data.prompts import pad_to_bucket
from jaxrl_llm.data.prompts import run_tokenizer
from jaxrl_llm.data.prompts import tokenize_prompts
from jaxrl_llm.data.sources import load_dataset
from jaxrl_llm.data.sources import load_demonstrations
from jaxrl_llm.data.sources import parse_source
