"""A training source's environment and renderer, built from its config fields.

  env = environment_for(source.env)             # config.data / config.sources.NAME fields
  renderer = renderer_for(tokenizer, env)       # with the env's tool schemas, probed

`tool_timeout_s` reaches a `ToolEnv` (whose constructor takes it) and no other class: a
user's plain `Environment` keeps the `env_args` it declares.
"""
from jaxrl_llm import import_path
from jaxrl_llm.envs import base
from jaxrl_llm.envs import chat
from jaxrl_llm.envs import tools


def environment_for(fields: dict) -> base.Environment:
  """The environment a source's fields name (`env`, `env_args`, `tool_timeout_s`)."""
  spec, env_args = fields["env"], dict(fields.get("env_args") or {})
  try:
    factory = import_path.load_function(spec)
  except Exception as e:  # pylint: disable=broad-except
    raise base.EnvError(f"Environment {spec!r} cannot be loaded: {type(e).__name__}: {e}") from e
  if isinstance(factory, type) and issubclass(factory, tools.ToolEnv):
    env_args.setdefault("tool_timeout_s", fields.get("tool_timeout_s"))
  return base.load_environment(spec, env_args)


def renderer_for(tokenizer, env, *, check: bool = True) -> chat.ChatRenderer:
  """The tokenizer's renderer with `env`'s tool schemas (if it has tools); with `check`, the
  template probe (`ChatRenderer.check_template`) has passed."""
  schemas = env.tool_schemas() if callable(getattr(env, "tool_schemas", None)) else None
  renderer = chat.ChatRenderer(tokenizer, tools=schemas)
  if check:
    renderer.check_template()
  return renderer


def close(env) -> None:
  """Stops what `env` runs in the background (a ToolEnv's worker), if anything."""
  if callable(getattr(env, "close", None)):
    env.close()
