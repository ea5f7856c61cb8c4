"""RoBERTa base: sizes and defaults in t5lite/models/presets.py (roberta)."""

from t5lite.models.presets import roberta


def get_config():
    return roberta("base")
