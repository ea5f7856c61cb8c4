"""ELECTRA small: sizes and defaults in t5lite/config/presets.py (electra)."""

from t5lite.config.presets import electra


def get_config():
    return electra("small")
