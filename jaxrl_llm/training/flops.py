"""Model FLOPs of an RL step and the peak they are measured against (the `mfu` metric).

Model FLOPs count the matmuls the algorithm needs, once: 2 per multiply-add of a weight
matmul, plus the two attention products over each query's causal context; elementwise work,
norms and the recomputation that remat or chunked log-probs add are not counted (the usual
definition of MFU, as in PaLM's appendix B). A backward pass counts twice its forward.

Per step (B = P·G rows of S0 prompt + N completion tokens, T = S0 + N):
  sample:  prefill of the P prompts once (the G samples share it) + one decode step per
           generated token, each over its S0 + k earlier slots;
  logprob: one forward over the batch per reference, recomputed old log-probs and values;
  update:  3 forwards (forward + backward) per pass over the batch, for `num_iterations`
           passes (the `num_minibatches` minibatches of a pass together cover it once), for
           the policy and, with a value model, for the critic.
Only completion positions are unembedded in training (the logits of prompt positions are
never formed), and only the last prompt position when prefilling.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm import distributed
from jaxrl_llm.models.flops import forward_flops

# Dense bf16 matmul peak per device (one TPU chip, one GPU), from the vendors' data sheets.
# Matched against `device.device_kind` in lower case, most specific first.
PEAK_BF16_FLOPS = (
    ("tpu v6 lite", 918e12), ("tpu v6e", 918e12),
    ("tpu v5 lite", 197e12), ("tpu v5e", 197e12), ("tpu v5p", 459e12), ("tpu v5", 459e12),
    ("tpu v4", 275e12),
    ("h100 pcie", 756e12), ("h100", 989e12), ("h200", 989e12), ("a100", 312e12),
)


def step_flops(model_config, algo, *, prompts: int, samples: int, prompt_len: int,
               new_tokens: int, generated: float | None, reference: bool, value: bool,
               recompute_old_logp: bool, teacher_config=None,
               hinted_len: int = 0) -> dict[str, float]:
  """Model FLOPs of one RL step by phase: {'sample', 'logprob', 'update', 'total'}.

  Args:
    model_config: the policy's `ModelConfig` (the reference and the critic share its shape).
    algo: `config.algo` (`num_iterations` is read).
    prompts, samples: P and G (B = P·G rows).
    prompt_len, new_tokens: S0 and N, the padded lengths the batch has.
    generated: tokens the sampler generated (None: completions come from the dataset).
    reference: a frozen reference scores the batch (KL term).
    value: a critic scores the batch and is trained with the policy.
    recompute_old_logp: the policy's old log-probs are recomputed before the update.
    teacher_config: the `ModelConfig` of a teacher that scores the batch (None: none).
    hinted_len: the padded length of the hinted rows the policy scores as its own teacher
      (self-distillation, `data.hints`), 0 without.
  """
  c, B, S0, N = model_config, prompts * samples, prompt_len, new_tokens
  T = S0 + N
  batch_forward = forward_flops(c, B * T, (T + 1) / 2, unembedded=B * N)
  sample = 0.0
  if generated is not None:
    mean_len = generated / B
    sample = (forward_flops(c, prompts * S0, (S0 + 1) / 2, unembedded=prompts)
              + forward_flops(c, generated, S0 + (mean_len + 1) / 2))
  critic_forward = forward_flops(c, B * T, (T + 1) / 2, unembedded=0)
  logprob = batch_forward * (reference + recompute_old_logp) + critic_forward * value
  if teacher_config is not None:
    logprob += forward_flops(teacher_config, B * T, (T + 1) / 2, unembedded=B * N)
  if hinted_len:
    logprob += forward_flops(c, B * hinted_len, (hinted_len + 1) / 2, unembedded=B * N)
  update = 3 * algo.num_iterations * (batch_forward + critic_forward * value)
  return {"sample": sample, "logprob": logprob, "update": update,
          "total": sample + logprob + update}


def table_peak(device_kind: str) -> float | None:
  """The data-sheet bf16 peak of a device kind, or None if the table does not know it."""
  kind = device_kind.lower()
  for name, peak in PEAK_BF16_FLOPS:
    if name in kind:
      return peak
  return None


def measured_peak(devices) -> float:
  """A float32 matmul rate per device, measured on all `devices` at once (the CPU fallback)."""
  n = 1024
  mesh = Mesh(np.asarray(devices), ("d",))
  x = jax.device_put(jnp.ones((len(devices), n, n), jnp.float32),
                     NamedSharding(mesh, PartitionSpec("d")))
  f = jax.jit(lambda a: jnp.einsum("bij,bjk->bik", a, a))
  f(x).block_until_ready()
  times = []
  for _ in range(5):
    t = time.perf_counter()
    f(x).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2 * n ** 3 / min(times)


def throughput(model_config, plan, rollout, arrays, times: dict[str, float], samples: int,
               new_tokens: int, peak: float, teacher_config=None) -> dict[str, float]:
  """Step times, tokens per second and model-FLOP utilisation of a step.

  Args:
    model_config: the policy's `ModelConfig`.
    plan: the run's `training.plan.Plan` (which forwards a step runs).
    rollout, arrays: the step's rollout and its training rows (`prepare.batch_arrays`).
    times: seconds of the step and of its phases: `step`, `sample`, `logprob`, `update`.
    samples, new_tokens: G and N.
    peak: the FLOP/s of all the mesh's devices together.
    teacher_config: the teacher's `ModelConfig` when one scores the batch.
  Judges (`config.judge`) add the FLOPs they spent scoring the rollout (`judge_flops`, every
  process's) to the step's.
  """
  prompts = len(rollout.prompts) * jax.process_count()
  sampled = rollout.logprobs is not None
  lengths = float(distributed.concat(rollout.lengths).sum())
  work = step_flops(
      model_config, plan.algo, prompts=prompts, samples=samples,
      prompt_len=arrays.tokens.shape[1] - new_tokens, new_tokens=new_tokens,
      generated=lengths if sampled else None, reference=plan.reference, value=plan.value_model,
      recompute_old_logp=plan.old_logp == "recompute", teacher_config=teacher_config,
      hinted_len=0 if arrays.hint_tokens is None else arrays.hint_tokens.shape[1])
  judge = float(np.sum(distributed.concat(np.asarray([rollout.judge_flops], np.float64))))
  train_tokens = float(distributed.sum_int(int(arrays.loss_mask.sum())))
  t_update = max(times["update"], 1e-9)
  return dict(step_time_s=times["step"], sample_time_s=times["sample"],
              logprob_time_s=times["logprob"], update_time_s=times["update"],
              mfu=(work["total"] + judge) / times["step"] / peak, update_mfu=work["update"] / t_update / peak,
              train_tokens_per_s=train_tokens * plan.algo.num_iterations / t_update,
              sample_tokens_per_s=lengths / max(times["sample"], 1e-9),
              **({"judge/flops": judge} if judge else {}))


def peak_flops_per_device(devices, override: float = 0.0) -> tuple[float, str]:
  """(peak FLOP/s of one device, where it came from): `override` if > 0
  (`config.train.peak_flops_per_device`), else the data sheet of the device kind, else a
  float32 matmul rate measured now (CPUs)."""
  if override > 0:
    return float(override), "config.train.peak_flops_per_device"
  kind = devices[0].device_kind
  peak = table_peak(kind)
  if peak is not None:
    return peak, f"bf16 data sheet of {kind!r}"
  local = [d for d in devices if d.process_index == jax.process_index()]
  return measured_peak(local), f"float32 matmul measured on {len(local)} {kind!r} device(s)"
