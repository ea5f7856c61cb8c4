"""BERT large: sizes and defaults in t5lite/config/presets.py."""

from t5lite.config.presets import bert


def get_config():
    return bert("large")
