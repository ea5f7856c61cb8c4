"""T5 v1.1 xxl: sizes and defaults in t5lite/config/presets.py."""

from t5lite.config.presets import t5_1_1


def get_config():
    return t5_1_1("xxl")
