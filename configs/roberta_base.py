"""RoBERTa base: sizes and defaults in t5lite/config/presets.py (roberta)."""

from t5lite.config.presets import roberta


def get_config():
    return roberta("base")
