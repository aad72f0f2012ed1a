"""`launch.compile`'s printed report: a table per program, the step's roofline, and when a
program does not fit, what to change."""
from __future__ import annotations

from jaxrl_llm import config as config_lib
from jaxrl_llm.aot import analysis

GIB = 2 ** 30
# The resident buffers' names as the report prints them.
_LABELS = {"policy": "policy", "optimizer": "optimizer", "value": "critic + its optimizer",
           "reference": "reference", "base": "frozen base", "teacher": "teacher",
           "sampler_policy": "sampler's copy of the policy", "sampler_base": "sampler's base",
           "kv_cache": "KV cache",
           "eval_kv_cache": "eval KV cache", "batch": "step's batch"}


def for_compiling(config):
  """`config` as the compiler needs it: a model path the user must still fill is the
  recipe's `model.arch` ('' : shapes only), a data source likewise a placeholder (nothing
  is read)."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    if config.model.path == config_lib.REQUIRED:
      config.model.path = ""
      config.data.chat_template = False  # the built-in tokenizer has no template
    if config.data.source == config_lib.REQUIRED:
      config.data.source = "jsonl:unread/{split}.jsonl"
  return config


def _gib(n: float) -> str:
  return f"{n / GIB:.2f}"


def _row(p: analysis.ProgramReport, hbm: int) -> str:
  if p.error is not None:
    return (f"| {p.name} | - | - | {_gib(p.temp_bytes)} | {_gib(sum(p.resident.values()))} | "
            f"{_gib(p.peak_bytes)} | {100 * p.peak_bytes / hbm:.0f}% | refused by XLA:TPU | | |")
  return (f"| {p.name} | {_gib(p.argument_bytes)} | {_gib(p.output_bytes - p.alias_bytes)} | "
          f"{_gib(p.temp_bytes)} | {_gib(sum(p.resident.values()))} | {_gib(p.peak_bytes)} | "
          f"{100 * p.peak_bytes / hbm:.0f}% | {p.flops / 1e12:.2f} | "
          f"{p.bytes_accessed / 1e9:.1f} | {p.roofline_s:.3g} |")


def text(result: analysis.StepReport, config, where: str) -> str:
  """The report's lines (the JSON line is printed after them)."""
  chip, mesh = result.chip, config.mesh
  lines = [f"{result.topology}: {where}; per chip {_gib(chip.hbm_bytes)} GiB HBM (XLA:TPU's "
           f"limit), {chip.peak_flops / 1e12:.0f} TFLOP/s bf16, {chip.hbm_bandwidth / 1e9:.0f} "
           f"GB/s ({chip.source})",
           f"mesh: data {mesh.data}, fsdp {mesh.fsdp}, expert {mesh.expert}, context "
           f"{mesh.context}, tensor {mesh.tensor}"
           + (f"; the sampler on {mesh.rollout_devices} chips of its own"
              if mesh.rollout_devices else "")
           + f"; micro-batch {config.train.micro_batch_size}, remat {config.model.remat}", "",
           "| per chip | arguments GiB | outputs GiB | temporaries GiB | resident beside GiB | "
           "peak GiB | of HBM | TFLOP | GB of HBM traffic | roofline s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  lines += [_row(p, chip.hbm_bytes) for p in result.programs]
  lines.append("")
  for p in result.programs:
    beside = ", ".join(f"{_LABELS.get(k, k)} {_gib(v)}" for k, v in p.resident.items() if v)
    where_ = f" on the sampler's chips" if p.placement == "sampler" else ""
    lines.append(f"{p.name}{where_}: resident beside it (GiB): {beside or 'nothing'}"
                 + (f"; kernels: {', '.join(p.kernels)}" if p.kernels else ""))
  runs = [p for p in result.programs if p.calls_per_step]
  parts = " + ".join(f"{p.name} {p.calls_per_step:g} x {p.roofline_s:.3g} s" for p in runs)
  if result.refused:
    refused = ", ".join(result.refused)
    return "\n".join(lines + ["", f"step: no roofline, XLA:TPU refused {refused} (out of HBM: "
                                "its time is unknown)"])
  lines += ["", f"step: {parts} = {result.step_roofline_s:.3g} s"
            + (" (the sampler's chips overlap the trainer's)" if result.overlapped else "")
            + f" -> MFU bound {100 * result.mfu_bound:.1f}% (a roofline bound from the "
            "compiler's FLOPs and bytes, not a measurement: no step runs faster on these chips)",
            "FLOPs count each loop body times its trips (the decode loop at max_new_tokens); "
            "a Pallas kernel counts its own cost estimate (an MoE grouped matmul's at the share "
            "of the experts a chip holds, routing even), or its bytes alone without one "
            "(splash attention)."]
  return "\n".join(lines)


def _advice(p: analysis.ProgramReport, config) -> str:
  """What would make program `p` smaller, by what dominates it."""
  t, mesh = config.train, config.mesh
  resident = sum(p.resident.values())
  if p.name in ("sampler", "eval_sampler", "turn"):
    tips = ("fewer rows per step (config.train.prompts_per_step) or new tokens "
            "(config.sampling.max_new_tokens), fewer decode slots (config.sampling.slots) or "
            "the static engine's cache (config.sampling.engine='static'), more tensor "
            "parallelism (config.mesh.tensor), or the sampler on chips of its own "
            "(config.mesh.rollout_devices)")
  elif p.name == "prepare":
    tips = (f"smaller forward micro-batches (config.train.micro_batch_size={t.micro_batch_size}) "
            f"or log-prob chunks (config.train.logprob_chunk_size={t.logprob_chunk_size})")
  else:
    tips = (f"a smaller micro-batch (config.train.micro_batch_size={t.micro_batch_size}: the "
            f"temporaries scale with it), model.remat='full' (now {config.model.remat!r}), "
            f"the sequence split over more devices (config.mesh.context={mesh.context}), or "
            f"more sharding of the weights (config.mesh.fsdp={mesh.fsdp}, expert={mesh.expert}, "
            f"tensor={mesh.tensor})")
  if resident > p.temp_bytes:
    largest = max(p.resident, key=p.resident.get)
    tips += (f"; what stays resident beside it ({_gib(resident)} GiB, most of it the "
             f"{_LABELS.get(largest, largest)}) shrinks with more fsdp/expert sharding, LoRA "
             "(config.lora.rank), split placement (config.mesh.rollout_devices) or a larger slice")
  return tips


def shortfall(result: analysis.StepReport, config) -> str:
  """One line per program that does not fit: how far over, and what to change."""
  limit = (1 - result.margin) * result.chip.hbm_bytes
  lines = []
  for p in result.programs:
    if result.fits(p):
      continue
    why = f"XLA:TPU refused it ({p.error}); " if p.error else ""
    lines.append(f"{p.name} does not fit: {why}peak {_gib(p.peak_bytes)} GiB per chip, "
                 f"{_gib(p.peak_bytes - limit)} GiB over the {_gib(limit)} GiB it may use "
                 f"({result.chip.name}'s {_gib(result.chip.hbm_bytes)} GiB"
                 + (f" less {100 * result.margin:g}% margin" if result.margin else "")
                 + f"). To fit: {_advice(p, config)}.")
  return "\n".join(lines)
