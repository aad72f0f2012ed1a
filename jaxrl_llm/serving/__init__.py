"""Serving the policy: a continuous-batching engine for requests that arrive at any time
(`engine`, over the device programs of `slots`) and an OpenAI-compatible HTTP endpoint over
it (`api`, `server`; `python -m launch.serve`); `partial` drives the same slots from the
caller's thread in a fixed order, for generations that span weight publishes."""
from jaxrl_llm.serving import server
from jaxrl_llm.serving.backend import (Backend, Call, Choice, EpisodeLog, RequestError,
                                       load_backend)
from jaxrl_llm.serving.engine import Completion, Engine, QueueFull, Request, prompt_columns
from jaxrl_llm.serving.partial import Finished, PartialEngine
from jaxrl_llm.serving.server import Server
from jaxrl_llm.serving.slots import Layout

__all__ = ["Backend", "Call", "Choice", "Completion", "Engine", "EpisodeLog", "Finished", "Layout", "PartialEngine", "QueueFull", "Request",
           "RequestError", "Server", "load_backend", "prompt_columns", "server"]
