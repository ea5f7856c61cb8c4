"""GPT-2 large: sizes and defaults in t5lite/models/presets.py."""

from t5lite.models.presets import gpt2


def get_config():
    return gpt2("large")
