"""Dotted keys on a config (``train.steps``, ``model.peft.lora_rank``): list, read, set.

set_by_path takes a string (a ``--set`` value, parsed as a Python literal) or an already-typed
value and checks it against the field's type; an unknown key fails with a suggestion.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import json
import typing
from typing import Any

from t5lite.errors import UserError


def all_keys(obj, prefix: str = "") -> list[str]:
    """Every leaf field of a config (or one section) as a dotted key."""
    keys = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            keys += all_keys(v, prefix + f.name + ".")
        else:
            keys.append(prefix + f.name)
    return keys


def get_by_path(cfg, key: str):
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def set_by_path(cfg, key: str, raw: Any) -> None:
    """Set ``a.b.c`` on cfg; ``raw`` is a string (parsed) or an already-typed value."""
    parts = key.split(".")
    obj = cfg
    for i, part in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(
            obj) else {}
        is_dict_entry = isinstance(obj, dict)
        if not is_dict_entry and part not in names:
            suggestions = difflib.get_close_matches(key, all_keys(cfg), n=3, cutoff=0.5)
            raise UserError(f"unknown config key {key!r}." + (
                f" Did you mean: {', '.join(suggestions)}?" if suggestions else
                " Valid sections: " + ", ".join(f.name for f in dataclasses.fields(cfg))))
        last = i == len(parts) - 1
        if not last:
            obj = obj[part] if is_dict_entry else getattr(obj, part)
            continue
        if is_dict_entry:
            obj[part] = parse_literal(raw)
        else:
            setattr(obj, part, coerce(raw, _field_types(type(obj))[part], key))


@functools.lru_cache(maxsize=None)
def _field_types(cls) -> dict:
    """A config section class's field types. Cached: the annotations are strings (postponed
    evaluation), and evaluating them on every --set made planning a paper table's rows (13k
    overrides) spend half its time in typing.get_type_hints. Callers must not mutate it."""
    return typing.get_type_hints(cls)


def parse_literal(raw):
    """A --set value as a Python literal when it is one, else the string itself (the caller's
    type check, coerce, says what is wrong)."""
    if not isinstance(raw, str):
        return raw
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def coerce(raw, hint, key: str):
    """``raw`` as a value of type ``hint`` (the field ``key``'s), or a UserError saying what
    kind of value the field takes."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union and type(None) in args:  # Optional[X]
        if raw in (None, "None", "none", "null"):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is str:
        return raw if isinstance(raw, str) else str(raw)
    value = parse_literal(raw)
    if hint is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise UserError(f"{key} must be true or false, got {raw!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{key} must be an integer, got {raw!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{key} must be a number, got {raw!r}")
        return float(value)
    if hint is tuple or origin is tuple:
        if isinstance(value, str):
            value = tuple(v for v in value.split(",") if v)
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{key} must be a list like a,b or ('a','b'), got {raw!r}")
        return tuple(value)
    if hint is dict or origin is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        if not isinstance(value, dict):
            raise UserError(f"{key} must be a dict like {{'inputs': 512}}, got {raw!r}")
        return value
    return value


def copy_config(cfg):
    """A deep copy of a config (or one section) that can be assigned to (never frozen)."""
    return dataclasses.replace(cfg, **{
        f.name: copy_config(getattr(cfg, f.name)) if dataclasses.is_dataclass(
            getattr(cfg, f.name)) else _copy_value(getattr(cfg, f.name))
        for f in dataclasses.fields(cfg)})


def _copy_value(v):
    return dict(v) if isinstance(v, dict) else v
