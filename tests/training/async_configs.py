"""The small config the asynchronous-rollout tests run (a random model that earns reward)."""
from configs import smoke


def golden_config(steps: int = 3):
  """GRPO with KL on the tiny model, 4 prompts x 8 samples of 8 tokens, rewarded per lowercase letter."""
  config = smoke.get_config()
  config.rewards.functions = ("tests.training.test_rewards:count_lowercase",)
  config.rewards.weights = (1.0,)
  config.train.steps = steps
  config.train.prompts_per_step = 4
  config.sampling.num_samples = 8
  config.sampling.max_new_tokens = 8
  config.train.micro_batch_size = 32
  config.optimizer.lr = 3e-3
  config.checkpoint.every = 0
  return config


def get_config(placement: str = "shared"):
  """`golden_config(4)` at max_async_level=1 on 8 devices, as the command line takes it
  (`multiprocess_configs.get_config("split")`), for the runs over two processes.

  shared: one data 2 x context 2 x tensor 2 mesh for the trainer and the sampler (each
  process's rows over its own context devices: split sequences in the update, rows of their
  own in the sampler); split: the sampler on 2
  devices of its own (one per process of a two-process run), the trainer data-parallel on
  the other 6.
  """
  config = golden_config(steps=4)
  config.algo.max_async_level = 1
  config.checkpoint.every = 2
  if placement == "shared":
    config.mesh.data, config.mesh.fsdp, config.mesh.context, config.mesh.tensor = 2, 1, 2, 2
  elif placement == "split":
    config.mesh.rollout_devices = 2
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
    config.train.prompts_per_step = 6  # 48 rows: 8 per trainer device, 3 prompts per process
    config.train.micro_batch_size = 48
  else:
    raise ValueError(f"placement={placement!r}: expected 'shared' or 'split'")
  return config
