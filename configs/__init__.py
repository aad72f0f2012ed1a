"""Experiment configs: one `get_config(arg=None)` per file (see common.py)."""
