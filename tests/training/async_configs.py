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
