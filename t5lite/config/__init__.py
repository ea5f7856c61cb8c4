"""Typed experiment config: schema (the sections, each field's rules beside it), dotted keys
and overrides, rules (validation), files (configs/*.py, dict round trips).

A config file is a Python file under configs/ that defines ``get_config() -> Config``.
Overrides are ``section.field=value`` strings (``--set train.steps=100``); values are parsed as
Python literals and checked against the field's type. Unknown keys fail with a suggestion.
A validated config (load_config's) is frozen: ``replace(cfg, {"train.steps": 20})`` derives a
changed one; config files build theirs by assignment on ``load_editable(name)`` or a fresh
``Config()``.
"""

from t5lite.config.dotted import all_keys, copy_config, get_by_path, set_by_path
from t5lite.config.files import (
    LEGACY_VALUES, apply_overrides, available_configs, configs_dir, cpu_recipe, flatten,
    from_dict, load_config, load_editable, replace, resolve_config_path, to_dict,
    with_decode_length)
from t5lite.config.rules import (check_fields, check_model, check_peft, decode_length,
                                 peft_enabled, validate)
from t5lite.config.schema import (
    CheckpointConfig, Config, DataConfig, DecodeConfig, ElectraConfig, EvalConfig, MeshConfig,
    ModelConfig, OptimizerConfig, PeftConfig, TrainConfig, freeze, is_frozen)

__all__ = [
    "CheckpointConfig", "Config", "DataConfig", "DecodeConfig", "ElectraConfig", "EvalConfig",
    "LEGACY_VALUES", "MeshConfig", "ModelConfig", "OptimizerConfig", "PeftConfig",
    "TrainConfig", "all_keys", "apply_overrides", "available_configs", "check_fields",
    "check_model", "check_peft", "peft_enabled", "configs_dir", "copy_config", "cpu_recipe",
    "decode_length", "flatten", "with_decode_length",
    "freeze", "from_dict", "get_by_path", "is_frozen", "load_config", "load_editable",
    "replace", "resolve_config_path", "set_by_path", "to_dict", "validate"]
