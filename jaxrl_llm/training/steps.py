"""Pure update steps: state in, state out; one function serves every algorithm.

The batch is a `rollouts.TrainBatch` (its fields are documented there): B rows,
prompt-major, with the arrays `prepare` computed (advantages, old log-probs, and per the
plan the reference's and teacher's log-probs, a mixed run's per-row weights, the value
targets). Which fields are set is decided by `config.algo`, once, in the plan; the steps
never look at an algorithm's name.

Micro-batches: a minibatch of B rows runs as M pieces of B / M rows (a `lax.scan`),
gradients summed. The loss normalisers come from the WHOLE minibatch
(`objectives.batch_counts`) and are handed to every piece, so the summed gradient is
exactly the minibatch's (see `objectives.aggregation`).

Non-finite guard: an update whose loss or gradient norm is not finite is skipped inside
the step (parameters and optimizer state come out unchanged) and flagged in the metrics
(`nonfinite_loss`, `nonfinite_grad`); the loop counts skipped steps and stops a run
after `config.train.max_consecutive_skips` of them in a row.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm import models, objectives
from jaxrl_llm.models import attention, lora, moe
from jaxrl_llm.training.rollouts.train_batch import TrainBatch
from jaxrl_llm.training.state import TrainState


def completion_split(batch) -> tuple[int, int]:
  """(S0, N): prompt and completion lengths of a batch."""
  N = batch.loss_mask.shape[1]
  return batch.tokens.shape[1] - N, N


def _completion_hidden(model: models.Model, batch, replay: bool = False, dropout_rng=None):
  """Final hidden states at the positions that predict each completion token: [B, N, D],
  and an MoE model's routing (`transformer.routing_summary`; None for a dense one).
  `replay`: route as `batch.routing` recorded (routing replay). `dropout_rng`: the key
  of the LoRA adapters' dropout (None: none).

  With context parallelism the sequence is padded at its end to a multiple of the pieces
  the 'seq' rule cuts it into (`attention.sequence_multiple`: on a TPU, of 128 tokens
  each), so that any length is split over the context devices: masked tokens after every
  real one, which causal attention never lets a real token see; their states and routing
  are dropped."""
  S0, T = completion_split(batch)[0], batch.tokens.shape[1]
  pad = -T % attention.sequence_multiple(model.mesh, model.rules)
  at_end = lambda x, fill=0: jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2),
                                     constant_values=fill)
  tokens, mask = at_end(batch.tokens), at_end(batch.attention_mask)
  hidden_BLD, _, routing = models.forward(
      model, tokens, models.positions_from_mask(mask), mask, return_hidden=True,
      routing_BTLk=at_end(batch.routing, -1) if replay else None, with_router=True,
      dropout_rng=dropout_rng)
  if routing is not None:
    routing = dict(routing, experts=routing["experts"][:, :T])
  return hidden_BLD[:, S0 - 1:T - 1], routing


def completion_logp(model: models.Model, batch, *, temperature: float, chunk_size: int,
                    entropy_grad: bool = False, replay: bool = False, with_router: bool = False,
                    dropout_rng=None):
  """`log_softmax(logits / T)` of every completion token and the entropy: [B, N] each.

  The same quantity the sampler reports as behaviour log-prob (before top-k/top-p), in
  chunks over the sequence so [B, N, V] float32 logits never exist whole. The entropy is
  differentiated only with `entropy_grad` (an entropy bonus); otherwise it is a metric.
  An MoE model: `replay` routes as `batch.routing` recorded; `with_router` also returns
  the routing (third). `dropout_rng`: the LoRA adapters' dropout key (None: no dropout).
  """
  S0, _ = completion_split(batch)
  hidden_BND, routing = _completion_hidden(model, batch, replay, dropout_rng)
  logp, entropy = objectives.chunked_token_logp_and_entropy(
      hidden_BND, batch.tokens[:, S0:], functools.partial(models.unembed, model),
      chunk_size=chunk_size, temperature=temperature, entropy_grad=entropy_grad)
  return (logp, entropy, routing) if with_router else (logp, entropy)


def completion_values(value_model: models.Model, batch):
  """The critic's V_t for the state before each completion token: [B, N]."""
  return models.unembed(value_model, _completion_hidden(value_model, batch)[0])


def replays_routing(model_config: models.ModelConfig, algo) -> bool:
  """Whether the policy's forwards route as the sampler recorded (`algo.routing_replay`)."""
  return model_config.is_moe and algo.get("routing_replay", "off") == "rollout"


def router_terms(cfg: models.ModelConfig, routing, batch, num_micro: int, tokens):
  """An MoE policy's router losses and metrics for one piece of a minibatch: (loss,
  metrics). The loss is router_aux_loss_coef * aux + router_z_loss_coef * z (`models.moe`),
  each piece's share 1 / num_micro, so the pieces add up to their mean. Metrics:
  moe/aux_loss, moe/z_loss, moe/expert_load_max, and with recorded routing
  moe/routing_mismatch: the share of (completion token, MoE layer) pairs whose experts in
  this forward differ from the sampler's (as sets; the positions that predict the loss
  mask's tokens; `tokens`: the whole minibatch's count of them)."""
  aux, z = moe.aux_loss(routing, cfg.num_experts), moe.z_loss(routing)
  loss = (cfg.router_aux_loss_coef * aux + cfg.router_z_loss_coef * z) / num_micro
  metrics = {"moe/aux_loss": aux / num_micro, "moe/z_loss": z / num_micro,
             "moe/expert_load_max": moe.expert_load_max(routing)}
  if batch.routing is not None:
    S0, _ = completion_split(batch)
    used = jnp.sort(routing["experts"][:, S0 - 1:-1], axis=-1)
    recorded = jnp.sort(batch.routing[:, S0 - 1:-1], axis=-1)
    differ_BNL = jnp.any(used != recorded, axis=-1).astype(jnp.float32)
    w_BN = batch.loss_mask.astype(jnp.float32)
    metrics["moe/routing_mismatch"] = (jnp.einsum("BNL,BN->", differ_BNL, w_BN)
                                       / (jnp.maximum(tokens, 1.0) * differ_BNL.shape[-1]))
  return loss, metrics


# --- micro-batch accumulation ------------------------------------------------------------------
def _combine(name: str, a, b):
  if name.endswith("_min"):
    return jnp.minimum(a, b)
  if name.endswith("_max"):
    return jnp.maximum(a, b)
  return a + b  # the rest are normalised by whole-minibatch counts: they add up


def _identity(name: str, x):
  if name.endswith("_min"):
    return jnp.full_like(x, jnp.inf)
  if name.endswith("_max"):
    return jnp.full_like(x, -jnp.inf)
  return jnp.zeros_like(x)


def _split(batch, num_micro: int):
  """[B, ...] arrays -> [M, B / M, ...]: row i of piece m is row i * M + m of the batch, so
  with a batch sharded over devices every piece takes an equal share of each device's rows."""
  def split(x):
    if x.shape[0] % num_micro:
      raise ValueError(f"a batch of {x.shape[0]} rows does not split into {num_micro} "
                       "micro-batches")
    return x.reshape((x.shape[0] // num_micro, num_micro) + x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def map_micro(fn: Callable, batch, num_micro: int):
  """`fn(batch)` (rows in, rows out) computed on `num_micro` pieces one after another.

  The pieces are the update's micro-batches (`accumulate`): the same shapes, so a forward
  here rounds like the update's own, bit for bit (the old log-probs a bf16 ratio compares
  against), and only one piece's activations exist at a time.
  """
  if num_micro == 1:
    return fn(batch)
  out = jax.lax.map(fn, _split(batch, num_micro))  # [M, B / M, ...]
  return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape((-1,) + x.shape[2:]), out)


def accumulate(loss_fn: Callable, params, batch, num_micro: int):
  """Loss, metrics and gradient of `loss_fn(params, batch)`, over `num_micro` pieces
  (`_split`), gradients summed."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if num_micro == 1:
    (loss, metrics), grads = grad_fn(params, batch)
    return loss, metrics, grads

  pieces = _split(batch, num_micro)
  first = jax.tree.map(lambda x: x[0], pieces)
  (_, metrics_shape), _ = jax.eval_shape(grad_fn, params, first)

  def body(carry, piece):
    loss_acc, metrics_acc, grads_acc = carry
    (loss, metrics), grads = grad_fn(params, piece)
    metrics_acc = {k: _combine(k, metrics_acc[k], metrics[k]) for k in metrics_acc}
    return (loss_acc + loss, metrics_acc, jax.tree.map(jnp.add, grads_acc, grads)), None

  init = (jnp.zeros((), jnp.float32),
          {k: _identity(k, jnp.zeros(v.shape, v.dtype)) for k, v in metrics_shape.items()},
          jax.tree.map(jnp.zeros_like, params))
  (loss, metrics, grads), _ = jax.lax.scan(body, init, pieces)
  return loss, metrics, grads


# --- the steps ---------------------------------------------------------------------------------
DROPOUT_SALT = 0x10A4  # folded into the run's key for the LoRA adapters' dropout


def _row_weights(rows: TrainBatch) -> dict:
  """A mixed run's per-row coefficients of the loss's terms ({} in a one-source run)."""
  weights = {"pg": rows.pg_weight, "distill": rows.distill_weight}
  return {k: v for k, v in weights.items() if v is not None}


def policy_step(state: TrainState, batch, base=None, *, model_static: models.Model, algo,
                optimizer, temperature: float, chunk_size: int, num_micro: int):
  """One optimizer update of the policy on one minibatch.

  Args:
    state: the train state (donated by the caller's jit).
    batch: the minibatch (`rollouts.TrainBatch`, as `prepare` filled it).
    base: with LoRA, the frozen base parameters (`lora.split`; the state trains the
      adapters and no gradient reaches these); None otherwise.
    model_static: a `Model` whose config/mesh/rules describe the policy (params ignored).
    algo: `config.algo`.
    optimizer: the policy's optax transformation.
    temperature: the sampling temperature the behaviour log-probs used.
    chunk_size: sequence positions per log-prob chunk.
    num_micro: micro-batches per minibatch.
  Returns:
    (new state, metrics: scalars).
  """
  counts = objectives.loss_counts(batch.loss_mask, _row_weights(batch))
  echo_count = (None if batch.echo_weights is None
                else objectives.echo_count(batch.echo_weights))

  is_moe = model_static.config.is_moe
  replay = replays_routing(model_static.config, algo)
  tokens = objectives.batch_counts(batch.loss_mask)["tokens"]
  dropout_rng = None  # LoRA dropout: one key per step (and update: the minibatch's rows differ)
  if model_static.config.lora_dropout > 0:
    dropout_rng = jax.random.fold_in(jax.random.fold_in(state.rng, DROPOUT_SALT), state.step)

  def loss_fn(params, piece):
    model = model_static.replace(params=params if base is None else lora.join(base, params))
    logp, entropy, routing = completion_logp(
        model, piece, temperature=temperature, chunk_size=chunk_size,
        entropy_grad=algo.loss.entropy_coef != 0, replay=replay, with_router=True,
        dropout_rng=dropout_rng)
    old_logp = (jax.lax.stop_gradient(logp) if piece.old_logp is None  # prepare.prepare_batch
                else piece.old_logp)
    loss, metrics = objectives.policy_loss(
        logp, old_logp, piece.advantages, piece.loss_mask, algo, ref_logp=piece.ref_logp,
        entropy=entropy, teacher_logp=piece.teacher_logp, row_weights=_row_weights(piece),
        counts=counts)
    if echo_count is not None:  # L = Σ ℓ_rl / N_rl + Σ ℓ_echo / N_echo
      echo, echo_metrics = objectives.echo_loss(logp, piece.echo_weights, echo_count)
      loss, metrics = loss + echo, dict(metrics, **echo_metrics)
    if is_moe:
      router_loss, router_metrics = router_terms(model.config, routing, piece, num_micro,
                                                 tokens)
      loss, metrics = loss + router_loss, dict(metrics, **router_metrics)
    return loss, metrics

  loss, metrics, grads = accumulate(loss_fn, state.policy_params, batch, num_micro)
  params, policy_opt, update_metrics = _apply_unless_nonfinite(
      optimizer, loss, grads, state.policy_params, state.policy_opt)
  metrics = dict(metrics, loss=loss, **update_metrics)
  return state.replace(policy_params=params, policy_opt=policy_opt), metrics


def value_step(state: TrainState, batch, *, model_static: models.Model, algo, optimizer,
               num_micro: int):
  """One optimizer update of the critic on one minibatch (PPO's value loss, times coef), on
  the tokens of `value_mask` (a mixed run: its gae sources' rows), else of `loss_mask`."""
  value_mask = lambda rows: rows.loss_mask if rows.value_mask is None else rows.value_mask
  counts = objectives.batch_counts(value_mask(batch))

  def loss_fn(params, piece):
    values = completion_values(model_static.replace(params=params), piece)
    loss, metrics = objectives.value_loss(values, piece.old_values, piece.returns,
                                          value_mask(piece), algo, counts=counts)
    return algo.value.coef * loss, dict(metrics, value_loss=loss)

  loss, metrics, grads = accumulate(loss_fn, state.value_params, batch, num_micro)
  params, value_opt, update_metrics = _apply_unless_nonfinite(
      optimizer, loss, grads, state.value_params, state.value_opt)
  metrics = dict(metrics, **{f"value_{k}": v for k, v in update_metrics.items()})
  return state.replace(value_params=params, value_opt=value_opt), metrics


def _apply_unless_nonfinite(optimizer, loss, grads, params, opt_state):
  """One optimizer update, skipped if the loss or the gradient norm is not finite.

  The gradient norm is non-finite exactly when some gradient entry is (or the sum of
  squares overflows, which no optimizer step survives either). A skipped update returns
  `params` and `opt_state` unchanged. Returns (params, opt_state, metrics): `grad_norm`
  and 0/1 flags saying which part was non-finite, which the trainer counts and reports.
  """
  grad_norm = optax.global_norm(grads)
  updates, new_opt_state = optimizer.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  bad_loss, bad_grad = ~jnp.isfinite(loss), ~jnp.isfinite(grad_norm)
  skip = bad_loss | bad_grad
  params, opt_state = jax.tree.map(lambda new, old: jnp.where(skip, old, new),
                                   (new_params, new_opt_state), (params, opt_state))
  return params, opt_state, {"grad_norm": grad_norm,
                             "nonfinite_loss": bad_loss.astype(jnp.float32),
                             "nonfinite_grad": bad_grad.astype(jnp.float32)}


def next_step(state: TrainState) -> TrainState:
  return state.replace(step=state.step + 1)
