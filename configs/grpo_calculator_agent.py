"""The agent demo again, played by an agent program through the policy's own endpoint.

configs/grpo_calculator.py with `jaxrl_llm.envs.calculator_agent:run` in place of the
built-in environment: a plain `openai` client tool loop (no jaxrl_llm import) that calls
the policy at the trainer's OpenAI-compatible endpoint, runs the `calc` tool itself and
returns the exact-match reward (logged as `reward/env`). The reward functions stay, at
weight 0, for the same `reward/calculator_exact` and valid-call rate as the environment's
run. The step's 64 agent programs run at once (`env_workers`), their calls batched by the
engine.

Run:
  python -m launch.train --config=configs/grpo_calculator_agent.py --workdir=/tmp/calc_agent

Expected result (seed 0): README, "Agents", has the curve beside the environment's.
"""
from jaxrl_llm import config as config_lib


def get_config(arg=None):
  config = config_lib.presets.load_module("grpo_calculator").get_config(arg)
  config.unlock()
  config.data.env = ""
  config.data.agent = "jaxrl_llm.envs.calculator_agent:run"
  config.data.env_workers = 64  # every episode of a step at once: the engine's 64 slots
  config.data.agent_timeout_s = 120.0
  config.rewards.weights = [0.0] * len(config.rewards.functions)
  return config_lib.finalize(config)
