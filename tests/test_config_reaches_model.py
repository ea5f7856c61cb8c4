"""Every ModelConfig field reaches the built model.

Several engineers edit the shared model files at once, and a merge can drop one field's hook
while the field still parses and its own module's tests still pass. This guard enumerates the
fields (dataclasses.fields, the PEFT and ELECTRA subsections included), builds a tiny model of
the family the field applies to with the field at its family's value and at other valid
values, and asserts that the model differs: its parameter tree (paths, shapes, dtypes) or, for
fields that change no parameter (activations, dropout, kernels, remat), the traced program of
``init`` (which runs the forward pass) in training mode, or else in eval mode (a setting read
only in eval). Only tracing: nothing is compiled.

A field that by design leaves the model alone goes in NOT_MODEL_FIELDS with why; any other
field that changes nothing fails here, so a new field must be wired (or listed) to pass CI.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

import jax
import numpy as np
import pytest

from t5lite.config import ModelConfig, presets
from t5lite.errors import UserError
from t5lite.models import gpu_attention
from t5lite.peft import build_model
from train_helpers import random_model_batch

# Fields that by design do not change the built model: field -> why.
NOT_MODEL_FIELDS = {
    "hf_class": "the Hugging Face class convert/ exports to; the model is the same",
    "electra.rtd_weight": "the RTD term's weight in train/losses.py, not in the model",
    "peft.freeze": "a mask over parameter paths for the optimizer (peft/masks.py)",
    "peft.train_only_peft": "which parameters the optimizer updates (peft/masks.py)",
    "peft.train_also": "parameter paths the optimizer also updates (peft/masks.py)",
    "peft.unfreeze_every": "gradual unfreezing: an optimizer mask over steps (peft/unfreeze.py)",
    "peft.unfreeze_layers": "gradual unfreezing: an optimizer mask over steps (peft/unfreeze.py)",
    "peft.save_peft_params": "what a checkpoint save writes (peft/files.py)",
}

# Sizes every family is shrunk to: the smallest model that still has each part; unscanned
# layers trace several times faster than nn.scan's lifted ones.
TINY = dict(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1,
            num_decoder_layers=1, max_length=16, scan_layers=False)
FAMILIES = {"t5": presets.t5_1_0, "bert": presets.bert, "gpt": presets.gpt2}

SWITCH = dict(ffn_layer="switch", num_experts=2)
PKM = dict(ffn_layer="pkm", pkm_keys=4, pkm_heads=1, pkm_knn=2, pkm_key_dim=8)
TWO_LAYERS = dict(num_encoder_layers=2, num_decoder_layers=2)
CLUSTERS = dict(vocab_clusters=((32, 0), (32, 8)))

# field -> (family, context: other fields set on both sides, values to try or None = derived).
# A field not listed here is tried on T5 (ModelConfig's defaults are T5's) with a derived
# value; fields of BERT's heads or GPT's learned positions, fields that act only beside another
# (MoE, PKM, RoPE, ...), and fields whose derived value is not valid or equal in effect to the
# family's need a row.
CASES = {
    "architecture": ("gpt", {}, None),  # prefix_lm vs decoder_only: same params, other mask
    "max_length": ("gpt", {}, None),  # the learned position table
    "embed_dim": ("bert", {}, None),
    "embed_like_classifier": ("t5", {"scale_tied_logits": False}, None),
    "num_token_types": ("bert", {}, None),
    "nsp_head": ("bert", {}, None),
    "pooler": ("bert", {}, None),
    "num_classes": ("bert", {}, None),
    "num_token_classes": ("bert", {}, None),
    "span_head": ("bert", {}, None),
    "sbo_head": ("bert", {}, None),
    "sbo_max_span_length": ("bert", {"sbo_head": True}, None),
    "mlm_predict_fraction": ("bert", {}, None),
    "ffn_layer": ("t5", {**PKM, "num_experts": 2}, None),
    "ffn_layer_every": ("t5", {**SWITCH, **TWO_LAYERS}, None),
    "ffn_layer_at": ("t5", {**SWITCH, **TWO_LAYERS}, [(0,)]),
    "ffn_layer_stacks": ("t5", SWITCH, None),
    "num_experts": ("t5", SWITCH, None),
    "expert_d_ff": ("t5", SWITCH, None),
    "expert_capacity_factor": ("t5", SWITCH, None),
    "moe_group_size": ("t5", SWITCH, [1024]),
    "decoder_expert_capacity_factor": ("t5", SWITCH, None),
    "decoder_expert_capacity_factor_eval": ("t5", SWITCH, None),  # eval mode only
    "moe_aux_loss_weight": ("t5", SWITCH, None),
    "router_jitter": ("t5", SWITCH, None),
    "pkm_keys": ("t5", PKM, None),
    "pkm_heads": ("t5", PKM, None),
    "pkm_knn": ("t5", PKM, None),
    "pkm_key_dim": ("t5", PKM, [12]),  # even: two halves
    "funnel_blocks": ("t5", TWO_LAYERS, [(1, 1)]),
    "encoder_norm": ("t5", {}, ["layernorm", "none"]),  # "rmsnorm" is T5's own norm
    # with one layer, unroll 0 (the whole stack) and 1 are the same loop
    "scan_unroll": ("t5", {**TWO_LAYERS, "scan_layers": True}, None),
    # "auto" is "cpu" on this host: compare both with "accelerator"
    "gradient_rules": ("t5", {"gradient_rules": "accelerator"}, None),
    # flash: no attention dropout; GPT has one attention to trace through Pallas, T5 three.
    # The GPU kernels and "auto": test_gpu_attention_kernels_change_the_built_model
    "attention_kernel": ("gpt", {"dropout_rate": 0.0}, ["flash"]),
    "rope_max_wavelength": ("t5", {"position": "rope"}, None),
    "synthesizer_rank": ("t5", {"attention_type": "synthesizer_factorized"}, None),
    "conv_kernel_size": ("t5", {"attention_type": "lightweight_conv"}, None),
    "conv_heads": ("t5", {"attention_type": "lightweight_conv"}, None),
    "output_softmax": ("t5", CLUSTERS, None),
    "adaptive_input": ("t5", CLUSTERS, None),
    "vocab_clusters": ("t5", {**CLUSTERS, "adaptive_input": True}, [((48, 0), (16, 8))]),
    "mos_components": ("t5", {"output_softmax": "mixture"}, None),
    "fixup": ("t5", {"norm": "none"}, None),
    "share_encoder_block": ("t5", TWO_LAYERS, None),
    "share_decoder_block": ("t5", TWO_LAYERS, None),
    "universal_mix_layers": ("t5", {"universal_steps": 1}, None),
    "universal_gating": ("t5", {"universal_steps": 1}, None),
    "peft.lora_alpha": ("t5", {"peft.lora_rank": 2}, None),
    "peft.lora_targets": ("t5", {"peft.lora_rank": 2}, [("query", "value", "wo")]),
    "electra.rtd_head": ("bert", {}, None),
    "electra.generator_d_model": ("bert", {"electra.rtd_head": True}, None),
    "electra.generator_d_ff": ("bert", {"electra.rtd_head": True,
                                        "electra.generator_d_model": 8}, None),
    # 0 means d_model // head_dim = 1 head and num_encoder_layers = 1 layer: try 2
    "electra.generator_num_heads": ("bert", {"electra.rtd_head": True,
                                             "electra.generator_d_model": 8}, [2]),
    "electra.generator_layers": ("bert", {"electra.rtd_head": True,
                                          "electra.generator_d_model": 8}, [2]),
}


def all_fields(cls=ModelConfig, prefix=""):
    """Dotted names of every leaf field of ``cls``, subsections included."""
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):  # a subsection: PeftConfig ...
            yield from all_fields(f.default_factory, prefix + f.name + ".")
        else:
            yield prefix + f.name


def get(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def field_meta(dotted):
    cls = ModelConfig
    *sections, name = dotted.split(".")
    for s in sections:
        cls = {f.name: f.default_factory for f in dataclasses.fields(cls)}[s]
    return {f.name: f for f in dataclasses.fields(cls)}[name].metadata


def replace(cfg, changes: dict):
    """A copy of ModelConfig ``cfg`` with dotted fields changed."""
    top, sub = {}, {}
    for key, value in changes.items():
        if "." in key:
            section, name = key.split(".")
            sub.setdefault(section, {})[name] = value
        else:
            top[key] = value
    for section, fields in sub.items():
        top[section] = dataclasses.replace(getattr(cfg, section), **fields)
    return dataclasses.replace(cfg, **top)


@functools.cache
def family_config(family):
    return dataclasses.replace(FAMILIES[family]("tiny").model, **TINY)


def derived_values(dotted, current):
    """Other valid values: every other choice; a flipped bool; int + 1; float doubled."""
    choices = field_meta(dotted).get("choices", ())
    if choices:
        return [c for c in choices if c != current]
    if isinstance(current, bool):
        return [not current]
    if isinstance(current, int):
        return [current + 1]
    if isinstance(current, float):
        return [current * 2 if current else 0.5]
    return []  # a tuple or free string: needs a row in CASES


def cases():
    for dotted in all_fields():
        if dotted in NOT_MODEL_FIELDS:
            continue
        family, context, values = CASES.get(dotted, ("t5", {}, None))
        base = replace(family_config(family), context)
        for value in values or derived_values(dotted, get(base, dotted)) or [None]:
            yield pytest.param(dotted, family, context, value, id=f"{dotted}={value}")


def trace(cfg, deterministic=False):
    """(parameter shapes, a digest of the traced program of init in training mode, or eval
    mode when ``deterministic``) of ``cfg``'s model. The batch is a constant of the program,
    not an argument: a field that only adds a batch feature (a head's labels) changes the
    program only where the model reads it; its tokens and positions are not all zero, so no
    table (RoPE's angles) folds to zeros, and its token ids are the same whatever the
    vocabulary fields."""
    model = build_model(cfg)
    batch = random_model_batch(cfg, 2, 8, 8, high=TINY["vocab_size"] // 2)
    keys = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    init = lambda keys: model.init(keys, batch, deterministic=deterministic)  # noqa: E731
    jaxpr, shapes = jax.make_jaxpr(init, return_shape=True)(keys)
    params = jax.tree_util.tree_flatten_with_path(shapes.get("params", {}))[0]
    # the text leaves out array constants (numpy tables made at trace time, e.g. RoPE's)
    program = hashlib.sha256(str(jaxpr).encode())
    for const in jaxpr.consts:
        if jax.dtypes.issubdtype(getattr(const, "dtype", None), jax.dtypes.prng_key):
            const = jax.random.key_data(const)
        program.update(np.asarray(const).tobytes() if hasattr(const, "shape") else
                       repr(const).encode())
    return [(jax.tree_util.keystr(p), s.shape, s.dtype) for p, s in params], program.digest()


@functools.cache
def traced(family, context_items, deterministic=False):
    return trace(replace(family_config(family), dict(context_items)), deterministic)


@pytest.mark.parametrize("dotted,family,context,value", list(cases()))
def test_field_changes_the_built_model(dotted, family, context, value):
    assert value is not None, (
        f"model.{dotted}: no non-default value can be derived; add a CASES row with a valid "
        "value (or, if it does not change the model by design, a NOT_MODEL_FIELDS entry)")
    base = replace(family_config(family), context)
    try:
        variant = replace(base, {dotted: value})
        params, program = trace(variant)
    except UserError as e:
        pytest.fail(f"model.{dotted}={value!r} on the {family} family is not valid ({e}); "
                    "give it a context or value in CASES")
    context_items = tuple(sorted(context.items()))
    base_params, base_program = traced(family, context_items)
    if (params, program) == (base_params, base_program):  # a setting read only in eval?
        params, program = trace(variant, deterministic=True)
        base_params, base_program = traced(family, context_items, deterministic=True)
    assert params != base_params or program != base_program, (
        f"model.{dotted}={value!r} (family value {get(base, dotted)!r}) changes neither the "
        f"parameter tree nor the traced program (training or eval) of the tiny {family} "
        "model: its hook was lost (wire it), or it does not change the model by design (add "
        "it to NOT_MODEL_FIELDS)")


# model.attention_kernel's other choices (cudnn, flash_gpu, auto) on a simulated GPU backend:
# there they trace (cuDNN's wrapper through XLA's implementation of the same call, the Triton
# kernels interpreted), while on this CPU host cudnn / flash_gpu are refused and auto is xla.
GPU_KERNELS = [c for c in field_meta("attention_kernel")["choices"] if c not in ("xla", "flash")]


@pytest.mark.parametrize("value", GPU_KERNELS)
def test_gpu_attention_kernels_change_the_built_model(monkeypatch, value):
    monkeypatch.setattr(gpu_attention, "default_backend", lambda: "gpu")
    monkeypatch.setattr(gpu_attention, "CUDNN_IMPLEMENTATION", "xla")
    monkeypatch.setattr(gpu_attention, "INTERPRET_OFF_GPU", True)
    family, context, _ = CASES["attention_kernel"]
    base = replace(family_config(family), {**context, "head_dim": 16})  # Triton: >= 16
    variant = replace(base, {"attention_kernel": value})
    picked = gpu_attention.resolve(variant)
    assert picked != "xla", f"attention_kernel={value} resolves to xla on a GPU"
    program = trace(variant)[1]
    assert program != trace(base)[1], (
        f"model.attention_kernel={value!r} traces the xla attention's program: its registry "
        "entry (models/plan.py ATTENTION_BACKENDS) or its Stack hook was lost")
    if picked != value:  # auto: the program of the kernel it picks
        assert program == trace(replace(base, {"attention_kernel": picked}))[1]


def test_the_tables_name_only_real_fields():
    """A renamed or removed field leaves no stale row behind."""
    names = set(all_fields())
    assert set(NOT_MODEL_FIELDS) <= names
    assert set(CASES) <= names
    assert not set(CASES) & set(NOT_MODEL_FIELDS)
    for _, context, _ in CASES.values():
        assert set(context) <= names
