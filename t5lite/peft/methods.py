"""Which PEFT methods a ModelConfig turns on, the names of the params they add, and their
config checks (``cfg.model.peft``, a PeftConfig)."""

from __future__ import annotations

from t5lite import config as config_lib

LORA_NAMES = ("lora_a", "lora_b")
IA3_NAMES = ("ia3_key", "ia3_value", "ia3_mlp")
PREFIX_NAMES = ("prefix_key", "prefix_value")
ADAPTER_SUFFIX = "_adapter"
PROMPT_NAME = "prompt"
PEFT_MARKER = "peft_only.json"


def enabled(mcfg) -> bool:
    """Any PEFT method on in this ModelConfig (freezing alone does not count)."""
    return config_lib.peft_enabled(mcfg)


def check(mcfg) -> None:
    """PEFT config errors, with what to do (mcfg: ModelConfig; the rules:
    config.rules.check_peft)."""
    config_lib.check_peft(mcfg)
