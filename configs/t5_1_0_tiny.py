"""T5 v1.0 tiny: sizes and defaults in t5lite/config/presets.py."""

from t5lite.config.presets import t5_1_0


def get_config():
    return t5_1_0("tiny")
