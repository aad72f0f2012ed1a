"""The configs tests/training/multiprocess_test.py trains over 2 processes x 4 devices and
over 1 x 8, as the command line takes them (`--config=tests/training/multiprocess_configs.py:smoke`)
and as `training.train` takes them in the test's own process (`get_config("smoke")`)."""
from configs import grpo_calculator
from configs import smoke
from tests.training import async_configs


def smoke_config():
  """GRPO on the tiny model over one 2 x 2 x 2 mesh: the eval at the start and at the last
  step, a checkpoint and the rollouts logged at step 2."""
  config = smoke.get_config()
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  config.train.steps = 2
  config.train.eval_every = 2
  config.data.task_options = dict(num_eval=6)
  config.optimizer.lr = 1e-3
  config.checkpoint.every = 2
  config.logging.rollouts_every = 2
  config.rewards.functions = ("tests.training.test_rewards:count_a",)
  config.rewards.weights = (1.0,)
  return config


def calculator_config():
  """The calculator agent (its shipped warm start, its tool environment) with asynchronous
  rollouts: each process plays its own records' episodes on its first device."""
  config = grpo_calculator.get_config("steps=2")
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  config.algo.max_async_level = 1
  config.train.prompts_per_step = 4
  config.train.micro_batch_size = 16
  config.train.eval_every = 2
  config.data.task_options = dict(config.data.task_options, num_eval=4)
  config.checkpoint.every = 2
  config.logging.rollouts_every = 2
  return config


def get_config(name: str = "smoke"):
  """smoke, calculator, or an asynchronous placement of `async_configs` (shared, split)."""
  if name in ("shared", "split"):
    return async_configs.get_config(name)
  return {"smoke": smoke_config, "calculator": calculator_config}[name]()
