"""The RL trainer: `train(config, workdir)` (see `loop.py`).

Modules, in the order a run uses them: `plan` (what the config's algorithm needs),
`resume` (whether the workdir's checkpoint belongs to this run), `setup` (mesh, models,
optimizer, state layout, compiled `programs`), `feed`
(each step's rollout: `rollout`, `async_rollouts`), `prepare` (rollout -> training
batch), `steps` (the pure update steps), `guards` (preemption, non-finite updates),
`metrics` and `flops` (what is logged), `trackers` (where: metrics.jsonl, TensorBoard,
wandb, MLflow, trackio), `evaluation` (held-out accuracy).
"""
from jaxrl_llm.training.evaluation import greedy_samples
from jaxrl_llm.training.loop import train
from jaxrl_llm.training.plan import Plan, make_plan
from jaxrl_llm.training.setup import Setup, set_up

__all__ = ["Plan", "Setup", "greedy_samples", "make_plan", "set_up", "train"]
