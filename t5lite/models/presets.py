"""The model-size presets live in t5lite.config.presets (a config file that builds on them then
loads without jax); this name keeps config files that import them from here working."""

from t5lite.config.presets import (  # noqa: F401
    BERT, ELECTRA, GPT2, SLICES, T5_1_0, T5_1_1, TINY_VOCAB, bert, electra, gpt2, roberta, t5_1_0,
    t5_1_1)
