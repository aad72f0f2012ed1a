"""The error every check of a run's config and inputs raises."""


class ConfigError(ValueError):
  """A config value, an input or the workdir is unusable; raised before anything loads,
  with one line naming the field (or input), the value and what was expected."""
