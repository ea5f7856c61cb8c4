"""GPT-2 small: sizes and defaults in t5lite/models/presets.py."""

from t5lite.models.presets import gpt2


def get_config():
    return gpt2("small")
