"""Which player plays a multi-turn source's episodes (`player_for`): the one choice, made
where the players are built, so that no player module imports another's chooser."""
from __future__ import annotations

import jax

from jaxrl_llm import platform, sampling
from jaxrl_llm.config.sources import Source
from jaxrl_llm.training.rollouts import admitted, agents, episodes


def player_for(source: Source, tokenizer, settings: sampling.SamplingSettings):
  """The player of a multi-turn source's episodes: its agent program's
  (`agents.AgentPlayer`), else its environment's: each episode admitted at its own pace
  on the slot engine (`admitted.AdmittedEpisodePlayer`), or the batch's turns in
  lockstep (`episodes.EpisodePlayer`), as `sampling.engine_kind` says for the platform of
  this process's first device."""
  if source.env.get("agent"):
    return agents.AgentPlayer(source, tokenizer, settings)
  where = platform.device_platform(jax.local_devices()[0])
  if sampling.engine_kind(settings, "episodes", where) == "turns":
    return episodes.EpisodePlayer(source, tokenizer, settings)
  return admitted.AdmittedEpisodePlayer(source, tokenizer, settings)
