"""The fields of a multi-turn source's environment (`env_config`), in `config.data` and in
each `config.sources.NAME` (`schema.data_config`, `schema.source_config`); `env_checks`
checks them."""
from __future__ import annotations


def env_config() -> dict:
  """A multi-turn source's environment (jaxrl_llm/envs, README "Agents"): the fields of
  `config.data` (one source) and of each `config.sources.NAME`. `env` '' = single-turn."""
  return {
      "env": "",  # 'path/to/env.py:MyEnv' | 'pkg.module:MyEnv'; '' = one completion per prompt
      "env_args": {},  # keyword arguments of its constructor
      "max_turns": 4,  # model turns per episode at most, >= 1
      "max_episode_tokens": 512,  # tokens per episode, the opening prompt included
      "tool_timeout_s": 10.0,  # a tool call's time limit (a ToolEnv's), > 0
      "env_workers": 1,  # environment instances stepping a batch's episodes concurrently, >= 1
      "on_env_error": "stop",  # stop | drop: an environment that raises stops the run, or its
                               # episode's group carries no loss and is counted (env/dropped)
      # An agent program instead of an environment: 'path/to/agent.py:run' | 'pkg.mod:run',
      # `async def run(client, record) -> reward | (reward, info)` (docs/agents.md); its
      # client is an openai.AsyncOpenAI bound to the policy's endpoint; env_workers programs
      # run at once, max_turns bounds its calls.
      "agent": "",
      "agent_timeout_s": 300.0,  # an agent program running longer is cancelled (dropped)
      # Training rows per agent episode: 1 = the trajectory of its last call; K > 1 = also
      # up to K - 1 earlier trajectories (calls that do not continue one another, e.g. under
      # a template that rewrites earlier turns), each its own row (the batch: P x G x K rows)
      "agent_samples": 1,
  }
