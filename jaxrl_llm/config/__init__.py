"""The config schema, its one validation, and presets.

```python
from jaxrl_llm import config
cfg = config.preset("grpo:runlocal")     # a preset by name (configs/grpo.py), or a file path
cfg.train.steps = 10
config.validate(cfg)                     # ConfigError naming field, value and expectation
```

`schema` owns every section's defaults and field docs (`base_config()`); `validate`
checks every value once, before anything loads (the trainer calls it first; the command
line turns a `ConfigError` into one line and exit status 2); `presets` loads experiment
files by name or path (`preset`) and gives them one skeleton (`make_preset`).
"""
from jaxrl_llm.config.algo_checks import validate_algo
from jaxrl_llm.config.presets import load as preset
from jaxrl_llm.config.presets import make_preset, parse_arg, ref, set_fields
from jaxrl_llm.config.schema import (REQUIRED, ConfigDict, base_config, finalize,
                                     shrink_for_local, source_config)
from jaxrl_llm.config.errors import ConfigError
from jaxrl_llm.config.inputs import check_inputs
from jaxrl_llm.config.keys import check_known_keys, unknown_key
from jaxrl_llm.config.validate import check_writable, validate

__all__ = ["REQUIRED", "ConfigDict", "ConfigError", "base_config", "check_inputs", "check_known_keys",
           "check_writable", "finalize", "make_preset", "parse_arg", "preset", "ref",
           "set_fields", "shrink_for_local", "source_config", "unknown_key", "validate", "validate_algo"]
