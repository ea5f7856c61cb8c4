"""T5ForConditionalGeneration <-> t5lite encoder_decoder: v1.0 (relu, head tied to the
embedding and rescaled by d_model**-0.5) and v1.1 (gated-gelu, own head)."""

from __future__ import annotations

import numpy as np

from t5lite.convert.common import (ACT_IN, Family, Rule, ffn_from_table, linear_rules,
                                   narrow_embedding_problems, norm_rules)

# HF gated activation names -> t5lite gated ffn names (feed_forward_proj "gated-<act>").
_GATED_IN = {"gelu": "geglu", "gelu_new": "geglu", "gelu_pytorch_tanh": "geglu",
             "relu": "reglu", "silu": "swiglu", "swish": "swiglu", "sigmoid": "glu",
             "linear": "bilinear"}
_FFN_OUT = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu",
            "geglu": "gated-gelu", "reglu": "gated-relu", "swiglu": "gated-silu",
            "glu": "gated-sigmoid", "bilinear": "gated-linear"}
_GATED = ("geglu", "reglu", "swiglu", "glu", "bilinear")


def scales_logits(hf_cfg: dict) -> bool:
    """transformers 5.x: scale_decoder_outputs, else (older configs) tie_word_embeddings."""
    return bool(hf_cfg.get("scale_decoder_outputs", hf_cfg.get("tie_word_embeddings", True)
                           is not False))


def _has_own_head(tensors: dict) -> bool:
    head, emb = tensors.get("lm_head.weight"), tensors.get("shared.weight")
    return head is not None and not (emb is not None and np.array_equal(head, emb))


def _fill_config(cfg, hf_cfg: dict, tensors) -> None:
    """``tensors`` decides tying: an lm_head that differs from the embedding means untied."""
    g, m = hf_cfg.get, cfg.model
    proj = g("feed_forward_proj", "relu")
    gated = proj.startswith("gated-")
    m.ffn = ffn_from_table(proj.split("-")[-1], _GATED_IN if gated else ACT_IN, proj)
    m.architecture = "encoder_decoder"
    m.vocab_size, m.d_model, m.d_ff = g("vocab_size", 32128), g("d_model", 512), g("d_ff", 2048)
    m.num_heads, m.head_dim = g("num_heads", 8), g("d_kv", 64)
    m.num_encoder_layers = g("num_layers", 6)
    m.num_decoder_layers = g("num_decoder_layers") or m.num_encoder_layers
    m.norm, m.norm_eps = "rmsnorm", g("layer_norm_epsilon", 1e-6)
    m.pre_norm, m.use_bias = True, False
    m.position = "relative"
    m.relative_buckets = g("relative_attention_num_buckets", 32)
    m.relative_max_distance = g("relative_attention_max_distance", 128)
    m.dropout_rate = float(g("dropout_rate", 0.1))
    m.scale_attn_logits, m.embed_norm, m.init_std = False, False, 0.0
    m.tie_embeddings = scales_logits(hf_cfg) and not _has_own_head(tensors or {})
    m.scale_tied_logits = m.tie_embeddings
    cfg.data.feature_lengths = {"inputs": 512, "targets": 114}


def _config_to_hf(m) -> dict:
    scaled = m.tie_embeddings and m.scale_tied_logits
    return {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
        "vocab_size": m.vocab_size, "d_model": m.d_model, "d_kv": m.head_dim, "d_ff": m.d_ff,
        "num_layers": m.num_encoder_layers, "num_decoder_layers": m.num_decoder_layers,
        "num_heads": m.num_heads, "relative_attention_num_buckets": m.relative_buckets,
        "relative_attention_max_distance": m.relative_max_distance,
        "dropout_rate": m.dropout_rate, "layer_norm_epsilon": m.norm_eps,
        "feed_forward_proj": _FFN_OUT[m.ffn], "is_encoder_decoder": True,
        # transformers < 5 reads tie_word_embeddings; 5.x reads scale_decoder_outputs.
        "tie_word_embeddings": scaled, "scale_decoder_outputs": scaled,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
        "initializer_factor": 1.0, "use_cache": True,
    }


def _attention_rules(m, stack: str, name: str, hf: str, layer: int) -> list:
    d, hk = m.d_model, m.num_heads * m.head_dim
    rules = []
    for t5lite_name, hf_name in (("query", "q"), ("key", "k"), ("value", "v")):
        rules += linear_rules((stack, "layers", name, t5lite_name), f"{hf}.{hf_name}", d, hk,
                              layer)
    return rules + linear_rules((stack, "layers", name, "out"), f"{hf}.o", hk, d, layer)


def _mlp_rules(m, stack: str, hf: str, layer: int) -> list:
    d, f = m.d_model, m.d_ff
    names = ("wi_0", "wi_1") if m.ffn in _GATED else ("wi",)
    rules = []
    for name in names:
        rules += linear_rules((stack, "layers", "mlp", name), f"{hf}.DenseReluDense.{name}",
                              d, f, layer)
    return rules + linear_rules((stack, "layers", "mlp", "wo"), f"{hf}.DenseReluDense.wo", f, d,
                                layer)


def _block_rules(m, stack: str, i: int) -> list:
    """Encoder block: self-attention, MLP; decoder block: self-, cross-attention, MLP."""
    d, b = m.d_model, f"{stack}.block.{i}.layer"
    if stack == "encoder":
        parts = (("pre_attention_layer_norm", "attention", "SelfAttention"),)
    else:
        parts = (("pre_self_attention_layer_norm", "self_attention", "SelfAttention"),
                 ("pre_cross_attention_layer_norm", "encoder_decoder_attention",
                  "EncDecAttention"))
    rules = []
    for j, (norm, name, hf_name) in enumerate(parts):
        rules += norm_rules((stack, "layers", norm), f"{b}.{j}.layer_norm", d, i, bias=False)
        rules += _attention_rules(m, stack, name, f"{b}.{j}.{hf_name}", i)
    j = len(parts)
    rules += norm_rules((stack, "layers", "pre_mlp_layer_norm"), f"{b}.{j}.layer_norm", d, i,
                        bias=False)
    return rules + _mlp_rules(m, stack, f"{b}.{j}", i)


def _rules(m) -> tuple[list, set]:
    d, v = m.d_model, m.vocab_size
    rules = [Rule(("token_embedder", "embedding"), "shared.weight", (v, d))]
    for stack, n in (("encoder", m.num_encoder_layers), ("decoder", m.num_decoder_layers)):
        rules.append(Rule((stack, "relpos_bias", "rel_embedding"),
                          f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                          (m.relative_buckets, m.num_heads), True))
        for i in range(n):
            rules += _block_rules(m, stack, i)
        rules += norm_rules((stack, f"{stack}_norm"), f"{stack}.final_layer_norm", d, bias=False)
    if not m.tie_embeddings:
        rules += linear_rules(("decoder", "logits_dense"), "lm_head", d, v)
    ignorable = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                 "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"}
    if m.tie_embeddings:
        ignorable.add("lm_head.weight")  # a copy of shared.weight (checked on import)
    return rules, ignorable


def _names_from_hf(hf_cfg: dict, tensors: dict) -> dict:
    """A base T5Model file may hold the embedding as encoder.embed_tokens only."""
    if "shared.weight" in tensors or "encoder.embed_tokens.weight" not in tensors:
        return tensors
    return {("shared.weight" if k == "encoder.embed_tokens.weight" else k): v
            for k, v in tensors.items()}


def _fix_imported(m, hf_cfg: dict, tensors: dict) -> dict:
    if not m.tie_embeddings:
        if "lm_head.weight" not in tensors:  # unscaled head saved as tied (transformers 5.x)
            tensors["lm_head.weight"] = tensors["shared.weight"]
        if scales_logits(hf_cfg):  # rescaled head with its own weights: fold the rescale
            tensors["lm_head.weight"] = tensors["lm_head.weight"] * np.float32(m.d_model ** -0.5)
    return tensors


def _fix_exported(m, hf_cfg: dict, tensors: dict) -> dict:
    if m.tie_embeddings and not m.scale_tied_logits:
        tensors["lm_head.weight"] = tensors["shared.weight"].copy()  # tied but unscaled
    return tensors


FAMILY = Family(
    name="t5", fill_config=_fill_config, config_to_hf=_config_to_hf, rules=_rules,
    export_needs=dict(architecture="encoder_decoder", norm="rmsnorm", pre_norm=True,
                      use_bias=False, position="relative", shared_encoder_decoder=False,
                      embed_norm=False, scale_attn_logits=False, num_classes=0),
    ffn_out=_FFN_OUT, tied_head=("lm_head.weight", "shared.weight"),
    names_from_hf=_names_from_hf, export_problems=narrow_embedding_problems,
    fix_imported=_fix_imported, fix_exported=_fix_exported)
