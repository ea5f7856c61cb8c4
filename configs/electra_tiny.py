"""ELECTRA tiny (BERT tiny's encoder + a 32-wide generator): t5lite/config/presets.py."""

from t5lite.config.presets import electra


def get_config():
    return electra("tiny")
