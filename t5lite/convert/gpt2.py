"""GPT2LMHeadModel <-> t5lite decoder_only: learned positions, Conv1D weights stored
[in, out], query / key / value fused in c_attn (one third each)."""

from __future__ import annotations

from t5lite.convert.common import (ACT_IN, ACT_OUT, Family, Rule, conv1d_rules, ffn_from_table,
                                   head_split_problems, linear_rules, narrow_embedding_problems,
                                   norm_rules)
from t5lite.errors import UserError


def _fill_config(cfg, hf_cfg: dict, tensors) -> None:
    g, m = hf_cfg.get, cfg.model
    m.ffn = ffn_from_table(g("activation_function", "gelu_new"), ACT_IN,
                           g("activation_function", "gelu_new"))
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("add_cross_attention", False)):
        if bool(g(key, ok)) != ok:
            raise UserError(f"GPT-2 with {key}={g(key)} is not supported (t5lite needs "
                            f"{key}={ok}).")
    m.architecture = "decoder_only"
    m.vocab_size, m.d_model = g("vocab_size", 50257), g("n_embd", 768)
    m.num_heads = g("n_head", 12)
    m.head_dim = m.d_model // m.num_heads
    m.d_ff = g("n_inner") or 4 * m.d_model
    m.num_encoder_layers, m.num_decoder_layers = 0, g("n_layer", 12)
    m.norm, m.norm_eps = "layernorm", g("layer_norm_epsilon", 1e-5)
    m.pre_norm, m.use_bias = True, True
    m.position, m.max_length = "learned", g("n_positions", 1024)
    m.dropout_rate = float(g("resid_pdrop", 0.1))
    m.tie_embeddings = g("tie_word_embeddings", True) is not False
    m.scale_attn_logits, m.embed_norm, m.scale_tied_logits = True, False, False
    m.init_std = float(g("initializer_range", 0.02))
    cfg.data.feature_lengths = {"targets": m.max_length}


def _config_to_hf(m) -> dict:
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": m.vocab_size, "n_positions": m.max_length, "n_embd": m.d_model,
        "n_layer": m.num_decoder_layers, "n_head": m.num_heads, "n_inner": m.d_ff,
        "activation_function": ACT_OUT[m.ffn], "resid_pdrop": m.dropout_rate,
        "embd_pdrop": m.dropout_rate, "attn_pdrop": m.dropout_rate,
        "layer_norm_epsilon": m.norm_eps, "initializer_range": m.init_std or 0.02,
        "scale_attn_weights": True, "tie_word_embeddings": m.tie_embeddings,
        "bos_token_id": m.vocab_size - 1, "eos_token_id": m.vocab_size - 1,
    }


def _rules(m) -> tuple[list, set]:
    d, f, v = m.d_model, m.d_ff, m.vocab_size
    rules = [Rule(("token_embedder", "embedding"), "transformer.wte.weight", (v, d)),
             Rule(("decoder", "position_embedder", "embedding"), "transformer.wpe.weight",
                  (m.max_length, d))]
    ignorable = set()
    for i in range(m.num_decoder_layers):
        h, p = f"transformer.h.{i}", ("decoder", "layers")
        rules += norm_rules(p + ("pre_self_attention_layer_norm",), f"{h}.ln_1", d, i)
        for j, name in enumerate(("query", "key", "value")):
            rules += conv1d_rules(p + ("self_attention", name), f"{h}.attn.c_attn", d, d, i,
                                  (j, 3))
        rules += conv1d_rules(p + ("self_attention", "out"), f"{h}.attn.c_proj", d, d, i)
        rules += norm_rules(p + ("pre_mlp_layer_norm",), f"{h}.ln_2", d, i)
        rules += conv1d_rules(p + ("mlp", "wi"), f"{h}.mlp.c_fc", d, f, i)
        rules += conv1d_rules(p + ("mlp", "wo"), f"{h}.mlp.c_proj", f, d, i)
        ignorable |= {f"{h}.attn.bias", f"{h}.attn.masked_bias"}  # causal-mask buffers
    rules += norm_rules(("decoder", "decoder_norm"), "transformer.ln_f", d)
    if m.tie_embeddings:
        ignorable.add("lm_head.weight")
    else:
        rules += linear_rules(("decoder", "logits_dense"), "lm_head", d, v)
    return rules, ignorable


def _names_from_hf(hf_cfg: dict, tensors: dict) -> dict:
    """A base GPT2Model file names its tensors without the 'transformer.' prefix."""
    return {(k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k): v
            for k, v in tensors.items()}


def _export_problems(m) -> list:
    bad = narrow_embedding_problems(m) + head_split_problems(m)
    if m.tie_embeddings and m.scale_tied_logits:
        bad.append("scale_tied_logits=True (GPT-2's tied head is not rescaled)")
    return bad


FAMILY = Family(
    name="gpt2", fill_config=_fill_config, config_to_hf=_config_to_hf, rules=_rules,
    export_needs=dict(architecture="decoder_only", norm="layernorm", pre_norm=True,
                      use_bias=True, position="learned", embed_norm=False,
                      scale_attn_logits=True, num_classes=0),
    ffn_out=ACT_OUT, tied_head=("lm_head.weight", "transformer.wte.weight"),
    names_from_hf=_names_from_hf, export_problems=_export_problems)
