"""The base of every config section: fields with their rules beside them (``setting``), and
sections that refuse unknown names and, once frozen, any assignment. schema.py and
model_schema.py build their sections on it; schema.py fills SECTION_PATHS once Config exists.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools

from t5lite.errors import UserError

FROZEN_MESSAGE = ("cannot set {key}: the config is frozen after validation. Pass overrides "
                  "to load_config(name, [\"{key}=...\"]) or derive a changed copy with "
                  "t5lite.config.replace(cfg, {{\"{key}\": ...}})")


def setting(default, *, choices: tuple = (), bounds: tuple = (None, None), meaning: str = ""):
    """A field whose rules sit beside it: ``choices`` (the allowed values), ``bounds`` ((low,
    high), both inclusive, None = unbounded) and ``meaning`` (what 0 / -1 mean, for the error
    message). config.rules.check_fields reads them."""
    return dataclasses.field(default=default, metadata={"choices": choices, "range": bounds,
                                                        "meaning": meaning})


@functools.cache
def field_names(cls) -> frozenset:
    return frozenset(f.name for f in dataclasses.fields(cls))


class Section:
    """Base of every config section: assignments only to known fields, and none when frozen;
    reading a name that is not a field (``cfg.trian.steps``) says which field was meant."""

    def __setattr__(self, name, value):
        pre = _prefix(type(self))
        if name not in field_names(type(self)):
            raise unknown_key(type(self), name)
        if self.__dict__.get("_frozen"):
            raise UserError(FROZEN_MESSAGE.format(key=pre + name))
        object.__setattr__(self, name, value)

    def __getattr__(self, name):  # only for names that are not attributes
        if name.startswith("_"):  # copy / pickle / hasattr probes
            raise AttributeError(name)
        raise unknown_key(type(self), name)


def _prefix(cls) -> str:
    prefix = SECTION_PATHS.get(cls, "")
    return prefix + "." if prefix else ""


def unknown_key(cls, name: str) -> "UnknownKeyError":
    """The error for ``name``, not a field of section ``cls``, with the closest fields."""
    pre = _prefix(cls)
    known = [pre + n for n in field_names(cls)]
    hint = difflib.get_close_matches(pre + name, known, n=3, cutoff=0.5)
    return UnknownKeyError(f"unknown config key {pre + name!r}." + (
        f" Did you mean: {', '.join(hint)}?" if hint else
        f" {cls.__name__} has: {', '.join(sorted(known))}"))


def freeze(section: Section) -> None:
    """Refuse every later assignment to ``section`` and the sections inside it (in place)."""
    object.__setattr__(section, "_frozen", True)
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, Section):
            freeze(value)


def is_frozen(section: Section) -> bool:
    return bool(section.__dict__.get("_frozen"))


class UnknownKeyError(UserError, AttributeError):
    """A config field that does not exist, assigned or read (load_config adds the file:line);
    an AttributeError too, so getattr(section, name, default) and hasattr keep working."""


# {section class: its dotted path in a Config} ("model.peft"), filled by schema.py
SECTION_PATHS: dict = {}
