"""BERT tiny: sizes and defaults in t5lite/models/presets.py."""

from t5lite.models.presets import bert


def get_config():
    return bert("tiny")
