"""ELECTRA small: sizes and defaults in t5lite/models/presets.py (electra)."""

from t5lite.models.presets import electra


def get_config():
    return electra("small")
