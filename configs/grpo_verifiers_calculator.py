"""The agent demo played by a verifiers taskset: configs/grpo_calculator_agent.py with
`jaxrl_llm.envs.verifiers_agent:run` (verifiers' `null` chat harness, its MCP tool `calc`
and its exact-match reward: `jaxrl_llm.envs.verifiers_calculator`) as the agent program.

Needs `pip install verifiers==0.4.0 uv` beside jaxrl_llm (Python >= 3.11; verifiers pins
openai < 3) and, for verifiers' chat program, PyPI or a warm uv cache
(jaxrl_llm/envs/verifiers_agent.py). Each episode starts a chat-program process, so
steps are smaller than the agent demo's: 4 problems x G = 4 per step.

Run:
  python -m launch.train --config=configs/grpo_verifiers_calculator.py --workdir=/tmp/vf_calc
"""
import os

from jaxrl_llm import config as config_lib

TASKSET = "jaxrl_llm.envs.verifiers_calculator"


def get_config(arg=None):
  os.environ.setdefault("VF_TASKSET", TASKSET)  # read by the agent program (in-process)
  config = config_lib.presets.load_module("grpo_calculator").get_config(arg)
  config.unlock()
  config.data.env = ""
  config.data.agent = "jaxrl_llm.envs.verifiers_agent:run"
  os.environ.setdefault("VF_MAX_TURNS", str(config.data.max_turns))
  config.data.env_workers = 16
  config.data.agent_timeout_s = 120.0
  if not config_lib.parse_arg(arg, steps=100, runlocal=False).runlocal:
    config.train.prompts_per_step = 4  # 16 episodes a step
    config.train.micro_batch_size = 16
  config.rewards.weights = [0.0] * len(config.rewards.functions)
  return config_lib.finalize(config)
