"""ELECTRA tiny (BERT tiny's encoder + a 32-wide generator): t5lite/models/presets.py."""

from t5lite.models.presets import electra


def get_config():
    return electra("tiny")
