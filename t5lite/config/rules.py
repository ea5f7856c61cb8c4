"""The config's rules, in one home: single fields (the choices and ranges declared beside each
field in schema.py, finiteness) and the rules across fields (validate for the whole config,
check_model / check_peft for a ModelConfig, which models.check and peft.check call so a model
config built in Python meets them too). Checks that need devices live in partitioning.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import math

from t5lite.config.dotted import get_by_path
from t5lite.config.mixing_rules import check_mixing
from t5lite.config.schema import Config, freeze
from t5lite.config.variant_rules import check_variants
from t5lite.errors import UserError


def _leaf_fields(obj, prefix: str = ""):
    """(dotted key, dataclasses.Field, value) of every leaf field of a config or a section."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaf_fields(value, prefix + f.name + ".")
        else:
            yield prefix + f.name, f, value


def check_fields(obj, prefix: str = "") -> None:
    """The one home of single-field rules: every field of ``obj`` (a Config, or one section
    such as a DecodeConfig with prefix "decode") against its declared choices and range, and
    finiteness. decoding.check / models.check call it for the section they get, so a config
    built in Python (not loaded from a file) meets the same rules."""
    pre = prefix + "." if prefix else ""
    for key, field, value in _leaf_fields(obj):
        full = pre + key
        choices = field.metadata.get("choices", ())
        if choices:
            if value not in choices:
                hint = difflib.get_close_matches(str(value), choices, n=1)
                raise UserError(f"{full}={value!r} is not one of {', '.join(choices)}."
                                + (f" Did you mean {hint[0]!r}?" if hint else ""))
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{full}={value} is not a finite number; give a finite value "
                            f"(the default is {get_by_path(_DEFAULT, full)})")
        lo, hi = field.metadata.get("range", (None, None))
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            want = (f"between {lo} and {hi}" if lo is not None and hi is not None else
                    f">= {lo}" if lo is not None else f"<= {hi}")
            raise UserError(f"{full}={value} is out of range: it must be {want}"
                            f"{field.metadata.get('meaning', '')}. Fix the config or its "
                            "--set override.")


def _check_ranges(cfg: Config) -> None:
    check_fields(cfg)
    for name, n in cfg.data.feature_lengths.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"data.feature_lengths[{name!r}]={n!r} must be a positive integer")
    for axis in ("data", "fsdp", "tensor"):
        n = getattr(cfg.mesh, axis)
        if n == 0 or n < -1:
            raise UserError(f"mesh.{axis}={n}: use a positive size, or -1 for the remaining "
                            "devices")


def validate(cfg: Config) -> Config:
    """Checks that need only the config (mesh/device checks live in partitioning.py), then
    freezes it: a validated config is never changed behind its checks (config.replace derives
    a changed one). Returns ``cfg``."""
    _check_ranges(cfg)  # every single field (choices, ranges); cross-field rules below
    m = cfg.model
    if cfg.data.batch_size % cfg.train.grad_accum_steps:
        raise UserError(f"data.batch_size={cfg.data.batch_size} must be divisible by "
                        f"train.grad_accum_steps={cfg.train.grad_accum_steps}")
    if not 0.0 <= m.dropout_rate < 1.0:
        raise UserError(f"model.dropout_rate must be in [0, 1), got {m.dropout_rate}")
    if not 0.0 <= m.mlm_predict_fraction <= 1.0 or (m.mlm_predict_fraction
                                                    and m.architecture != "encoder_only"):
        raise UserError(f"model.mlm_predict_fraction={m.mlm_predict_fraction}: use 0 (logits "
                        "at every position) or a fraction in (0, 1] of the length with "
                        "architecture='encoder_only' (BERT MLM)")
    if m.embed_dim < 0 or (m.embed_dim and m.architecture != "encoder_only"):
        raise UserError(f"model.embed_dim={m.embed_dim}: use 0 (= d_model), or a width > 0 "
                        "with architecture='encoder_only' (ELECTRA's embedding_size)")
    _check_electra(m)
    check_positions(m, cfg.data.feature_lengths)
    if cfg.train.aux_lm_weight < 0 or (cfg.train.aux_lm_weight and (
            m.num_classes <= 0 or m.architecture not in ("decoder_only", "prefix_lm"))):
        raise UserError(f"train.aux_lm_weight={cfg.train.aux_lm_weight}: use 0, or a weight "
                        ">= 0 (GPT-1: 0.5) with a decoder-only classifier (model.num_classes > 0)")
    freeze(cfg)
    return cfg


def decode_length(cfg: Config) -> int:
    """New tokens to generate: decode.max_length, or when it is 0 (the default) the targets'
    length, so decoding follows data.feature_lengths["targets"] unless set."""
    n = cfg.decode.max_length or cfg.data.feature_lengths.get("targets", 0)
    if n <= 0:
        raise UserError("decode.max_length=0 follows data.feature_lengths['targets'], which "
                        "this config lacks: set decode.max_length to the tokens to generate.")
    return n


def model_lengths(architecture: str, feature_lengths) -> dict:
    """{stack: the longest sequence it gets} for these task feature lengths, as the seqio
    feature converters build them (tasks/converters.py): a decoder-only or prefix LM packs
    inputs and targets into one sequence, so their lengths add up."""
    inputs, targets = feature_lengths.get("inputs", 0), feature_lengths.get("targets", 0)
    if architecture == "encoder_only":
        return {"encoder": inputs}
    if architecture == "encoder_decoder":
        return {"encoder": inputs, "decoder": targets}
    return {"decoder": inputs + targets}


def check_positions(m, feature_lengths) -> None:
    """A learned position table has model.max_length rows: a longer sequence would read past
    it (NaN from the first step, which looks like a learning-rate problem). m: ModelConfig."""
    if m.position != "learned":
        return
    for stack, n in model_lengths(m.architecture, feature_lengths).items():
        if n > m.max_length:
            what = ("inputs + targets, packed into one sequence" if stack == "decoder" and
                    m.architecture in ("decoder_only", "prefix_lm") and
                    "inputs" in feature_lengths else "its feature length")
            raise UserError(
                f"data.feature_lengths={dict(feature_lengths)} gives the {stack} {n} tokens "
                f"({what}) but model.position='learned' has only model.max_length="
                f"{m.max_length} positions: lower data.feature_lengths to {m.max_length} "
                "tokens in all, or raise model.max_length (a new, untrained table).")


def _check_electra(m) -> None:
    e = m.electra
    if (e.rtd_head or e.generator_d_model) and m.architecture != "encoder_only":
        raise UserError("model.electra.* (ELECTRA) needs architecture='encoder_only'.")
    if e.generator_d_model and not e.rtd_head:
        raise UserError("model.electra.generator_d_model > 0 needs model.electra.rtd_head=True "
                        "(the generator only feeds the discriminator).")
    if min(e.generator_d_model, e.generator_d_ff, e.generator_num_heads,
           e.generator_layers) < 0 or e.rtd_weight < 0:
        raise UserError("model.electra.generator_* and rtd_weight must be >= 0.")


def check_model(m) -> None:
    """Model config errors, with what to do about them (m: ModelConfig). models.check."""
    check_fields(m, "model")
    if m.shared_encoder_decoder and m.architecture != "encoder_decoder":
        raise UserError("model.shared_encoder_decoder=True needs architecture=encoder_decoder.")
    if m.shared_encoder_decoder and m.num_encoder_layers != m.num_decoder_layers:
        raise UserError("model.shared_encoder_decoder=True needs num_encoder_layers == "
                        "num_decoder_layers (one set of layer weights).")
    if m.num_classes > 0 and m.architecture == "encoder_decoder":
        raise UserError("model.num_classes>0 is for encoder_only / decoder_only models; T5 "
                        "classifies by generating the label text (set num_classes=0).")
    if m.sbo_head and (m.architecture != "encoder_only" or m.sbo_max_span_length < 1):
        raise UserError("model.sbo_head (SpanBERT) is a BERT head: use architecture="
                        "encoder_only and model.sbo_max_span_length >= 1.")
    if (m.num_token_classes > 0 or m.span_head) and m.architecture != "encoder_only":
        raise UserError("model.num_token_classes / model.span_head are BERT heads: use "
                        "architecture=encoder_only (T5 tags or extracts spans as text).")
    check_peft(m)
    check_variants(m)
    if m.position == "rope" and m.head_dim % 2:
        raise UserError(f"position=rope needs an even head_dim, got {m.head_dim}.")
    if m.position == "sinusoidal" and m.d_model % 2:
        raise UserError(f"position=sinusoidal needs an even d_model, got {m.d_model}.")
    check_mixing(m)


def peft_enabled(m) -> bool:
    """Any PEFT method that adds modules or params is on in ModelConfig ``m`` (freezing alone
    does not count)."""
    p = m.peft
    return bool(p.lora_rank or p.prompt_tokens or p.prefix_tokens or p.adapter_dim or p.ia3)


def check_peft(m) -> None:
    """PEFT config errors, with what to do (m: ModelConfig). peft.check."""
    p = m.peft
    for name in ("lora_rank", "prompt_tokens", "prefix_tokens", "adapter_dim"):
        if getattr(p, name) < 0:
            raise UserError(f"model.peft.{name} must be >= 0, got {getattr(p, name)}")
    if p.lora_rank and not p.lora_targets:
        raise UserError("model.peft.lora_rank>0 needs model.peft.lora_targets, e.g. "
                        "query,value (names of dense layers: query key value out wi wo ...)")
    if p.unfreeze_every < 0 or p.unfreeze_layers < 1:
        raise UserError("model.peft.unfreeze_every must be >= 0 and unfreeze_layers >= 1")


_DEFAULT = Config()
