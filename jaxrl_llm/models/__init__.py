"""Policy, reference and value models: one Flax decoder, several parameter trees.

```python
from jaxrl_llm import models
model = models.from_pretrained(path, dtype="float32")            # HF-format local directory
logits = models.compute_logits(model, input_ids, attention_mask)  # int [B, T] -> float32 [B, T, V]
models.save_pretrained(model, path)                               # transformers can load it
policy = models.with_lora(model, 16, 32, ("qkv_proj", "o_proj"), rng)  # LoRA adapters (`lora`)
models.save_adapter(policy, adapter_dir, path)                    # PEFT's format
```

A `Model` is a pytree: its parameters are the leaves, its `ModelConfig` (and the mesh and
sharding rules it is placed with) are static, so a `Model` can be passed to `jax.jit`.

The package's modules:
  model.py        `Model`; random init, abstract and sharded parameters, placement.
  forward_pass.py the forward inside a caller's jit; jitted `compute_logits`, `compute_values`.
  variants.py     models made from a model: LoRA, an int8 base, merged, frozen, a critic.
  pretrained.py   Hugging Face directories: `from_pretrained`, `save_pretrained`, `save_adapter`.
  config.py       `ModelConfig`, read from and written to HF `config.json`.
  flops.py        model FLOPs of a forward pass (training's MFU, the judge's count).
  load.py         Hugging Face checkpoints <-> our parameter tree.
  transformer.py  the decoder; its parts in attention.py, moe.py (expert_parallel.py),
                  value_head.py, lora.py and quant.py.
  kv_cache.py     the sampler's KV cache.
"""
from jaxrl_llm.models import kv_cache, load, lora, quant
from jaxrl_llm.models.config import ModelConfig, from_hf_dict, to_hf_dict
from jaxrl_llm.models.forward_pass import (COMPILER_OPTIONS, compute_logits, compute_values,
                                           forward, positions_from_mask, unembed)
from jaxrl_llm.models.model import (PARAM_LAYOUT, Model, abstract_params, init, param_shardings,
                                    place)
from jaxrl_llm.models.pretrained import from_pretrained, save_adapter, save_pretrained
from jaxrl_llm.models.transformer import Transformer
from jaxrl_llm.models.variants import (FLOAT32_PARAMS, frozen, frozen_params, merged,
                                       quantize_base, value_model, with_lora)

__all__ = [
    "Model", "ModelConfig", "abstract_params", "compute_logits", "compute_values", "forward",
    "from_pretrained", "frozen", "frozen_params", "init", "init_cache", "merged", "place", "positions_from_mask",
    "quantize_base", "save_adapter", "save_pretrained", "unembed", "value_model", "with_lora",
]

init_cache = kv_cache.init_cache
