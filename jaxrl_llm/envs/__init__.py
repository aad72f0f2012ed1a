"""Multi-turn environments with tools: the host side (pure Python, no jax).

  from jaxrl_llm import envs
  env = envs.load_environment('path/to/calc_env.py:CalcEnv', {'tool_timeout_s': 5})
  tokenizer.chat_template = envs.CHAR_TOOL_CHAT_TEMPLATE        # or the model's own
  renderer = envs.ChatRenderer(tokenizer, tools=env.tool_schemas())
  renderer.check_template()                                     # TemplateError if not exact
  episode = envs.run_episode(env, renderer, record, sample_turn, max_turns=4,
                             max_episode_tokens=1024, where="environment 'calc', record 17")
  row = episode.as_row()            # tokens, loss_mask, behaviour_logprobs, messages, ...
  env.tool_stats.take()             # {'calls': 3, 'ok': 2, 'timeout': 1, ...}
  env.close()                       # stops the tool worker process

Modules: `base` (the Environment protocol, result checks, `load_environment`,
`call_env`), `tools` (ToolEnv: <tool_call> parsing, schemas, counted failures),
`worker` (tool calls in a killable worker process, or a thread), `loading` (a
training source's environment and renderer from its config fields), `chat` (ChatRenderer:
prompt and suffix ids, the template probe), `templates` (a ChatML-like template with
tools for the character tokenizer), `episode` (Episode, run_episode).

Nothing here imports jax, flax or transformers at import time: the tool worker process
imports this package and must start fast.
"""
from jaxrl_llm.envs.base import EnvError
from jaxrl_llm.envs.base import Environment
from jaxrl_llm.envs.base import StepResult
from jaxrl_llm.envs.base import as_messages
from jaxrl_llm.envs.base import as_step_result
from jaxrl_llm.envs.base import call_env
from jaxrl_llm.envs.base import load_environment
from jaxrl_llm.envs.chat import ChatRenderer
from jaxrl_llm.envs.chat import TemplateError
from jaxrl_llm.envs.episode import ENDINGS
from jaxrl_llm.envs.episode import Episode
from jaxrl_llm.envs.episode import run_episode
from jaxrl_llm.envs.loading import environment_for
from jaxrl_llm.envs.loading import renderer_for
from jaxrl_llm.envs.templates import CHAR_TOOL_CHAT_TEMPLATE
from jaxrl_llm.envs.templates import CHAR_TOOL_NAMES_TEMPLATE
from jaxrl_llm.envs.tools import ToolCall
from jaxrl_llm.envs.tools import ToolCallError
from jaxrl_llm.envs.tools import ToolEnv
from jaxrl_llm.envs.tools import ToolStats
from jaxrl_llm.envs.tools import parse_tool_calls
