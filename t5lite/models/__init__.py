"""Models: ``build_model(cfg)`` for every architecture, dummy batches, KV cache, param counts.

See CONTRACTS.md ("Models") for the call conventions and architectures.py for the param tree.
The models package never imports t5lite.peft: a PEFT model is the core architecture built
with the Stack modules t5lite.peft chooses (``peft.build_model(cfg)`` passes them in).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite.models import plan as plan_lib
from t5lite.models import sharing
from t5lite.models.architectures import ARCHITECTURES
from t5lite.models.electra import HEAD_PREFIXES as ELECTRA_HEADS
from t5lite.models.electra import Electra
from t5lite.models.transformer import CORE_MODULES, StackModules
from t5lite.text_table import format_table

# Published parameter counts: HF T5ForConditionalGeneration (t5-small, t5-base,
# google/t5-v1_1-base), BertModel incl. pooler (bert-base-uncased), GPT2LMHeadModel (gpt2).
PUBLISHED = {
    "t5_1_0_small": 60_506_624,
    "t5_1_0_base": 222_903_552,
    "t5_1_1_base": 247_577_856,
    "bert_base": 109_482_240,
    "gpt2_small": 124_439_808,
}


def _model_cfg(cfg):
    return getattr(cfg, "model", cfg)  # accept a full Config too


def check(cfg) -> None:
    """Model config errors, with what to do about them (the rules: config.rules.check_model)."""
    config_lib.check_model(cfg)


def build_model(cfg, modules: StackModules | None = None) -> nn.Module:
    """The flax module for ``cfg.architecture`` (a ModelConfig or a full Config), its Stacks
    built from ``modules`` (the core layers by default; t5lite.peft passes its own)."""
    cfg = _model_cfg(cfg)
    check(cfg)
    if modules is None:
        if config_lib.peft_enabled(cfg):
            raise UserError("model.peft turns a PEFT method on: build this model with "
                            "t5lite.peft.build_model(cfg), which adds its modules.")
        modules = CORE_MODULES
    # every variant choice, once (plan.py); the stacks' modules from ``modules``
    plan = plan_lib.model_plan(cfg, modules)
    if cfg.electra.rtd_head:  # ELECTRA: the encoder_only model with a generator + RTD head
        return Electra(cfg, plan)
    return ARCHITECTURES[cfg.architecture](cfg, plan)


def _decoder_length(cfg, feature_lengths: dict) -> int:
    if cfg.architecture == "prefix_lm":  # PrefixLMFeatureConverter packs inputs + targets
        return feature_lengths.get("inputs", 0) + feature_lengths["targets"]
    return feature_lengths["targets"]


def dummy_batch(cfg, batch_size: int, feature_lengths: dict) -> dict:
    """int32 zeros (ones for segment ids / loss weights) with the keys the architecture reads."""
    cfg = _model_cfg(cfg)
    zeros = lambda n: np.zeros((batch_size, n), np.int32)  # noqa: E731
    ones = lambda n: np.ones((batch_size, n), np.int32)  # noqa: E731
    batch = {}
    need = {"encoder_decoder": ("inputs", "targets"), "encoder_only": ("inputs",)}.get(
        cfg.architecture, ("targets",))
    missing = [k for k in need if k not in feature_lengths]
    if missing:
        raise UserError(f"data.feature_lengths needs {missing} for architecture "
                        f"{cfg.architecture}, got {feature_lengths}.")
    if cfg.architecture in ("encoder_decoder", "encoder_only"):
        n = feature_lengths["inputs"]
        batch.update(encoder_input_tokens=zeros(n), encoder_segment_ids=ones(n),
                     encoder_positions=zeros(n))
    if cfg.architecture == "encoder_only":
        n = feature_lengths["inputs"]
        batch.update(encoder_target_tokens=zeros(n), encoder_loss_weights=ones(n))
        if cfg.num_token_types > 0:
            batch["encoder_token_type_ids"] = zeros(n)
        if cfg.nsp_head:
            batch["nsp_labels"] = np.zeros((batch_size,), np.int32)
        if cfg.sbo_head:
            batch.update({f"encoder_span_{k}": zeros(n) for k in ("left", "right", "offset")})
    else:
        n = (feature_lengths["targets"] if cfg.architecture == "encoder_decoder"
             else _decoder_length(cfg, feature_lengths))
        batch.update(decoder_input_tokens=zeros(n), decoder_target_tokens=zeros(n),
                     decoder_loss_weights=ones(n), decoder_segment_ids=ones(n),
                     decoder_positions=zeros(n))
        if cfg.architecture == "prefix_lm":
            batch["decoder_causal_attention"] = zeros(n)
    if cfg.num_classes > 0:
        batch["class_labels"] = np.zeros((batch_size,), np.int32)
    if cfg.num_token_classes > 0:
        batch.update(token_labels=zeros(feature_lengths["inputs"]),
                     token_label_weights=ones(feature_lengths["inputs"]))
    if cfg.span_head:
        batch.update(start_positions=np.zeros((batch_size,), np.int32),
                     end_positions=np.zeros((batch_size,), np.int32))
    return batch


def init_cache(model, params, batch_size: int, max_length: int, encoder_input_tokens=None):
    """An empty decoding cache (flax "cache" collection) for ``max_length`` decoder tokens."""
    cfg = model.cfg
    if cfg.architecture == "encoder_only":
        raise UserError("encoder_only models (BERT) do not decode; use an encoder_decoder, "
                        "decoder_only or prefix_lm model.")
    tokens = jnp.zeros((batch_size, max_length), jnp.int32)
    kwargs = {}
    if cfg.architecture == "encoder_decoder":
        if encoder_input_tokens is None:
            raise UserError("init_cache for an encoder_decoder model needs encoder_input_tokens.")
        n = encoder_input_tokens.shape[1]
        kwargs = dict(encoder_input_tokens=jnp.zeros((batch_size, n), jnp.int32))

    def shapes(params):
        call = dict(kwargs)
        if call:  # the encoder output's own shape (Funnel pools it, transparent stacks it)
            call["encoded"] = model.apply({"params": params}, call["encoder_input_tokens"],
                                          method="encode")
        _, variables = model.apply({"params": params}, tokens, decode=True, mutable=["cache"],
                                   method="decode", **call)
        return variables["cache"]

    abstract = jax.eval_shape(shapes, params)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract)


HEAD_PREFIXES = ("mlm_", "nsp_", "class_", "token_dense", "span_dense", "sbo")


def abstract_params(cfg, feature_length: int = 8, modules: StackModules | None = None):
    """Boxed parameter shapes via jax.eval_shape (nothing allocated); ``modules`` as
    build_model's."""
    cfg = _model_cfg(cfg)
    model = build_model(cfg, modules)
    lengths = {"inputs": feature_length, "targets": feature_length}
    batch = dummy_batch(cfg, 1, lengths)
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    return jax.eval_shape(lambda: model.init(rngs, batch, deterministic=True))["params"]


def count_params(cfg, heads: bool = True) -> int:
    """Number of parameters; ``heads=False`` leaves out task heads (MLM, NSP, classifier)."""
    return _counts(abstract_params(cfg))[0 if heads else 1]


def layerwise_counts(cfg) -> tuple[int, int]:
    """_counts(abstract_params(cfg)), traced with one unscanned layer per stack.

    Every layer of a stack has the same parameters, so layers_0's count times the stack's depth
    is the stack's count; tracing one plain layer costs less than half of tracing the scanned
    stack (nn.scan's lifting), and `t5lite models` traces every config.
    """
    cfg = _model_cfg(cfg)
    if not plan_lib.layers_alike(cfg):  # a mixture-of-experts / PKM / Funnel stack
        return _counts(abstract_params(cfg))
    depth = {"encoder": cfg.num_encoder_layers, "decoder": cfg.num_decoder_layers,
             # ELECTRA's generator stack (models/electra.py): its own depth
             "generator": cfg.electra.generator_layers or cfg.num_encoder_layers}
    one = dataclasses.replace(
        cfg, scan_layers=False, num_encoder_layers=min(1, depth["encoder"]),
        num_decoder_layers=min(1, depth["decoder"]),
        electra=dataclasses.replace(cfg.electra, generator_layers=min(1, depth["generator"])))
    total = body = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(nn.meta.unbox(abstract_params(one)))[0]:
        keys = [str(getattr(k, "key", k)) for k in path]
        n = math.prod(leaf.shape)
        if len(keys) > 1 and keys[1] == "layers_0" and not (
                keys[0] in ("encoder", "decoder") and sharing.shares_block(cfg, keys[0])):
            n *= depth[keys[0]]
        total += n
        body += 0 if keys[0].startswith(HEAD_PREFIXES + ELECTRA_HEADS) else n
    return total, body


def _counts(params) -> tuple[int, int]:
    """(all params, params outside the task heads) of a (boxed or abstract) param tree."""
    total = body = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(nn.meta.unbox(params))[0]:
        n = math.prod(leaf.shape)
        total += n
        head = str(getattr(path[0], "key", path[0])).startswith(HEAD_PREFIXES + ELECTRA_HEADS)
        body += 0 if head else n
    return total, body


def param_count_table(names=None) -> str:
    """One row per model config under configs/ (top level) with its parameter count."""

    if not names:
        names = sorted(n for n in config_lib.available_configs() if "/" not in n)
    rows = [("config", "architecture", "d_model", "layers", "params", "w/o heads", "published",
             "TPU slice")]
    for name in names:
        full = config_lib.load_config(name)
        cfg = full.model
        total, body = layerwise_counts(cfg)
        n_layers = {"encoder_decoder": f"{cfg.num_encoder_layers}+{cfg.num_decoder_layers}",
                    "encoder_only": str(cfg.num_encoder_layers)}.get(
            cfg.architecture, str(cfg.num_decoder_layers))
        pub = PUBLISHED.get(name)
        pub_s = f"{pub / 1e6:.1f}M ({100 * (body - pub) / pub:+.2f}%)" if pub else ""
        rows.append((name, cfg.architecture, str(cfg.d_model), n_layers, _human(total),
                     _human(body), pub_s, full.mesh.topology))
    return format_table(rows) + (
        "\nparams: every trainable parameter. w/o heads: without task heads (BERT MLM "
        "transform + output bias, NSP, classifier), i.e. BertModel with pooler; "
        "T5 and GPT-2 count their (tied or untied) LM head. TPU slice: the one the config's "
        "mesh, remat and batch are chosen for (mesh.topology; `t5lite compile` defaults to it).")


def _human(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
