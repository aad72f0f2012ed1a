"""Hugging Face I/O: load a `Model` from a transformers directory, save one back, and save
its LoRA adapters in PEFT's format.
"""
from __future__ import annotations

import json

import jax
import numpy as np
import safetensors.numpy
from jax.sharding import Mesh

from jaxrl_llm import paths
from jaxrl_llm import sharding as sh
from jaxrl_llm.models import load, lora
from jaxrl_llm.models.config import from_hf_dict, to_hf_dict
from jaxrl_llm.models.model import Model, place
from jaxrl_llm.models.variants import merged


def from_pretrained(path: str, dtype: str = "float32", *, param_dtype: str | None = None,
                    remat: str = "none", attention: str = "auto", mesh: Mesh | None = None,
                    rules=sh.DEFAULT_RULES) -> Model:
  """Loads a Hugging Face directory (config.json + safetensors).

  Args:
    path: the directory, local or gs:// (read from a local copy, `paths.local_copy`).
    dtype: compute dtype name ('float32', 'bfloat16', 'float16').
    param_dtype: parameter dtype name (default: `dtype`).
    remat: what the backward pass keeps of each layer ('none', 'dots', 'full').
    attention: the training attention kernel ('auto', 'xla', 'blockwise', 'cudnn', 'splash').
    mesh, rules: place the parameters on this mesh (default: keep them on the host as numpy
      arrays; jitted calls copy them to the default device).
  """
  cfg = from_hf_dict(load.read_config(path), dtype=dtype, param_dtype=param_dtype, remat=remat,
                     attention=attention)
  model = Model(load.load_params(path, cfg), cfg)
  return place(model, mesh, rules) if mesh is not None else model


def _host(x) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def save_pretrained(model: Model, path: str, *, max_shard_bytes: int = 5 * 2**30) -> None:
  """Writes `model` as a Hugging Face directory that transformers' Auto classes load.

  `path` is local or gs://.

  With several processes, every process must call this (the parameters are gathered);
  only process 0 writes.
  """
  if model.config.head != "lm":
    raise ValueError("only language models (head='lm') save to the Hugging Face format; "
                     "checkpoint a value model with the trainer's orbax checkpoints")
  model = merged(model)  # adapters added in, an int8 base dequantized
  hf_config = to_hf_dict(model.config)
  params = jax.tree.map(_host, model.params)
  if jax.process_index() != 0:
    return
  paths.makedirs(path)
  load.save_params(load.hf_tensors(params, model.config), path, max_shard_bytes)
  paths.write_atomic(paths.join(path, load.CONFIG_FILE), json.dumps(hf_config, indent=2))


def save_adapter(model: Model, path: str, base_model_name_or_path: str | None) -> None:
  """Writes `model`'s adapters in PEFT's format (adapter_config.json and
  adapter_model.safetensors, `lora`), for `peft.PeftModel.from_pretrained` onto the base
  at `base_model_name_or_path`. Every process calls it; process 0 writes."""
  if not model.config.has_lora:
    raise ValueError("save_adapter needs a model with LoRA adapters (models.with_lora)")
  adapters = jax.tree.map(_host, lora.split(model.params)[1])
  if jax.process_index() != 0:
    return
  paths.makedirs(path)
  paths.write_atomic(paths.join(path, lora.PEFT_WEIGHTS_FILE), safetensors.numpy.save(
      dict(lora.peft_tensors(adapters, model.config)), metadata={"format": "pt"}))
  paths.write_atomic(paths.join(path, lora.PEFT_CONFIG_FILE), json.dumps(
      lora.adapter_config(model.config, base_model_name_or_path), indent=2))
