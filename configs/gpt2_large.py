"""GPT-2 large: sizes and defaults in t5lite/config/presets.py."""

from t5lite.config.presets import gpt2


def get_config():
    return gpt2("large")
