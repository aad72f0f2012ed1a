"""The error every check of a run's config and inputs raises."""


class ConfigError(ValueError):
  """A config value, an input or the workdir is unusable; raised before anything loads,
  with one line naming the field (or input), the value and what was expected."""


def fail(field: str, value, expected: str):
  """Raises the one-line error of a config field: 'config.FIELD=VALUE: expected ...'."""
  raise ConfigError(f"config.{field}={value!r}: expected {expected}")


def one_of(field: str, value, allowed) -> None:
  if value not in allowed:
    fail(field, value, f"one of {list(allowed)}")
