"""The group sampler: G completions per prompt, with behaviour log-probs, in one program.

```python
from jaxrl_llm import sampling
out = sampling.generate(model, prompts, num_samples=G, max_new_tokens=N,
                        temperature=1.0, top_k=0, top_p=1.0, eos_ids=(...), seed=0)
```

One jitted program per (model, prompt bucket, settings): prefill the P prompts once, into a
KV cache that the G samples of each prompt then share as a read-only prefix (`kv_cache`'s
shared-prefix layout: the prompt's keys and values are read once per prompt, not once per
row), then a `lax.while_loop` decodes one token for all B = P*G rows per step until every row
has finished (EOS or N tokens).

Prompts are left-padded to the smallest bucket length that holds the longest one, so a new
prompt length inside a bucket reuses the compiled program. The rows' own KV buffers (keys
[B, K, Dh, N], values [B, K, N, Dh] per layer, one slot per generated token) live in a
`Sampler` between calls and are donated to each call: their slots are rewritten in place,
never reallocated.

Behaviour log-prob: for each sampled token, `log_softmax(logits / temperature)` of the
full vocabulary, taken BEFORE top-k / top-p truncation. This is the quantity the trainer
recomputes from the policy (same temperature, no truncation), so the importance ratio
of an on-policy batch is exactly 1 up to numerics. With temperature 0 (greedy) it is
`log_softmax(logits)`.

Two engines run that contract (`SamplingSettings.engine`): the static one above, and
`continuous`: a fixed number of decode slots over a paged KV cache, a slot taking the next
completion as soon as its own ends, so that a long tail of lengths does not keep every row
decoding. Every completion (request r = p*G + g) draws its tokens from its own keys,
fold_in(fold_in(key, r), t) for its column t, so both engines give a request the same
completion for the same key. `Sampler(...)(model, prompts, seed, budgets)` also takes a
per-completion budget of new tokens.

Modules: `settings` (what a program is specialised on), `choose` (the token draw and its
keys), `decode` (per-platform tuning of the decode loop, the one place that asks where it
runs, and the parts of a program: decode weights, prefill), `output` (`SampleOutput`),
`sampler` (the static program, `Sampler`, `generate`), `continuous` (the continuous program),
`page_pool` (its state and pages: admission, preemption),
`turns` (multi-turn episodes over a KV cache kept between turns, `TurnSampler`).
"""
from jaxrl_llm.sampling import continuous, page_pool
from jaxrl_llm.sampling.choose import (choose_tokens, gumbel_noise, numbered_keys, request_keys,
                                       token_keys)
from jaxrl_llm.sampling.decode import (DECODE_TUNING, DecodeTuning, decode_weight_shardings,
                                       unrolls_layers)
from jaxrl_llm.sampling.sampler import (DEFAULT_BUCKETS, GENERATE_CACHE_SIZE, SampleOutput,
                                        Sampler, bucket_length, free_generate_cache, generate,
                                        left_pad)
from jaxrl_llm.sampling.settings import (CONTINUOUS_FROM_NEW_TOKENS, ENGINES, LAYER_LOOPS,
                                         WEIGHT_LAYOUTS, WORKLOADS, SamplingSettings,
                                         engine_kind, eos_ids, pad_id, turn_settings)
from jaxrl_llm.sampling.turns import TurnOutput, TurnSampler

__all__ = ["CONTINUOUS_FROM_NEW_TOKENS", "DECODE_TUNING", "DEFAULT_BUCKETS", "DecodeTuning",
           "ENGINES", "GENERATE_CACHE_SIZE", "LAYER_LOOPS", "SampleOutput", "Sampler",
           "SamplingSettings", "TurnOutput", "TurnSampler", "WEIGHT_LAYOUTS", "WORKLOADS", "bucket_length", "choose_tokens", "continuous",
           "decode_weight_shardings", "engine_kind", "eos_ids", "free_generate_cache", "generate", "gumbel_noise",
           "left_pad", "numbered_keys", "pad_id", "page_pool", "request_keys", "token_keys", "turn_settings",
           "unrolls_layers"]
