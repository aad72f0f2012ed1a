"""Presets: one experiment per file, `get_config(arg=None)` (see jaxrl_llm/config)."""
