"""Row overrides in `--set` syntax, where `key:=expr` computes the value from the stage's config
as it stands at that point (``cfg``, ``L`` = inputs length, and the length helpers below), so
a row such as "half the layers" or "targets long enough for 50% corruption" holds at any
scale."""

from __future__ import annotations

import math
from typing import Sequence

from t5lite import config as config_lib
from t5lite.errors import UserError


def _round_up(n: float, k: int = 8) -> int:
    return int(math.ceil(n / k) * k)


def iid_targets(inputs_length: int, density: float) -> int:
    """Targets length for i.i.d. corruption with spans -> sentinels on inputs_length - 1
    tokens: noise + one sentinel per noise run (expected n d (1 - d)) + EOS, 25% headroom."""
    from t5lite.tasks.objectives import iid_targets_length
    return iid_targets_length(inputs_length, density)


def drop_targets(inputs_length: int, density: float) -> int:
    """Targets length for "drop corrupted tokens" on the i.i.d. rows' inputs_length - 1 token
    chunks (the dropped tokens + EOS), 25% headroom."""
    return _round_up(1.25 * ((inputs_length - 1) * density + 1))


def span_targets(inputs_length: int, density: float, mean_span: float) -> int:
    """Targets length for span corruption as T5's random_spans_helper gives it (where T5's
    helper and mask disagree, seqio trims the surplus: objectives.t5.span_surplus measures it)."""
    from t5lite.tasks.objectives import random_spans_helper
    return random_spans_helper(inputs_length, density, mean_span)[1]


def scaled(key: str, ratio: str, multiple: int = 1) -> str:
    """The override setting model.``key`` to the scale's value times ``ratio`` (an expression,
    e.g. "4 / 3"), rounded to a multiple of ``multiple``, at least one of them: a row's size
    change that holds at every scale (exact at the paper's model)."""
    if multiple == 1:
        return f"model.{key}:=max(1, round(cfg.model.{key} * {ratio}))"
    return f"model.{key}:={multiple} * max(1, round(cfg.model.{key} * {ratio} / {multiple}))"


def num_layers(cfg) -> int:
    """Layer groups opened one by one under gradual unfreezing (cfg: a full Config)."""
    from t5lite.peft import total_layers
    return total_layers(cfg.model)


def _expression_names(cfg) -> dict:
    """What a `key:=expr` override may name."""
    return {"cfg": cfg, "L": cfg.data.feature_lengths.get("inputs", 0),
            "iid_targets": iid_targets, "drop_targets": drop_targets,
            "span_targets": span_targets, "num_layers": num_layers,
            "min": min, "max": max, "int": int, "round": round}


def resolve(base: str, layers: Sequence[str]) -> tuple[list[str], config_lib.Config]:
    """Apply ``layers`` (key=value or key:=expr) to the config file ``base``; -> (plain
    key=value overrides, each key once, equivalent to ``layers``; the validated Config)."""
    base_cfg = config_lib.load_config(base)
    plain = []
    for item in layers:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"override {item!r} must look like key=value or key:=expression")
        key, value = key.strip(), value.strip()
        if key.endswith(":"):
            cfg = config_lib.apply_overrides(base_cfg, plain)
            names = _expression_names(cfg)
            try:
                value = eval(value, {"__builtins__": {}}, names)  # noqa: S307
            except Exception as e:
                raise UserError(f"cannot compute {item!r}: {type(e).__name__}: {e}") from None
            # a string is the value as typed (a task name), anything else its literal
            value = value if isinstance(value, str) else repr(value)
            key = key[:-1]
        plain.append(f"{key}={value}")
    last = {p.partition("=")[0]: i for i, p in enumerate(plain)}
    plain = [p for i, p in enumerate(plain) if last[p.partition("=")[0]] == i]
    cfg = config_lib.apply_overrides(base_cfg, plain)
    config_lib.validate(cfg)
    return plain, cfg


def split_user_overrides(overrides: Sequence[str]) -> dict:
    """`--set` items -> {"pretrain": [...], "finetune": [...]}; a `pretrain.` / `finetune.`
    prefix picks one stage, anything else goes to both."""
    out = {"pretrain": [], "finetune": []}
    for item in overrides:
        stage = item.split(".", 1)[0]
        if stage in out:
            out[stage].append(item.split(".", 1)[1])
        else:
            for v in out.values():
                v.append(item)
    return out

