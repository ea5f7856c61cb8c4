"""BERT-style encoders <-> t5lite encoder_only: BertForPreTraining / BertForMaskedLM (MLM head,
NSP head and pooler when the file has them), RobertaForMaskedLM (the BERT rules on renamed
tensors) and ElectraForPreTraining (the discriminator: the BERT encoder under ``electra.``,
embeddings of width embedding_size + embeddings_project, the RTD head).

RoBERTa numbers positions from padding_idx + 1: t5lite's position p is HF's row
p + padding_idx + 1; import drops the rows below and export writes them back as zeros.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from t5lite.convert.common import (ACT_IN, ACT_OUT, Family, Rule, ffn_from_table,
                                   head_split_problems, linear_rules, narrow_embedding_problems,
                                   norm_rules)
from t5lite.errors import UserError

# RoBERTa tensor names -> BERT's (prefix and LM head)
_ROBERTA_NAMES = (("roberta.", "bert."), ("lm_head.dense.", "cls.predictions.transform.dense."),
                  ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
                  ("lm_head.decoder.", "cls.predictions.decoder."),
                  ("lm_head.bias", "cls.predictions.bias"))
_BERT_POSITIONS = "bert.embeddings.position_embeddings.weight"
_ROBERTA_POSITIONS = "roberta.embeddings.position_embeddings.weight"
_NSP = "cls.seq_relationship.weight"
_POOLER = "bert.pooler.dense.weight"


def _roberta_offset(hf_cfg: dict) -> int:
    return int(hf_cfg.get("pad_token_id", 1)) + 1


def _rename(name: str, pairs) -> str:
    for old, new in pairs:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _roberta_to_bert(hf_cfg: dict, tensors: dict) -> dict:
    offset = _roberta_offset(hf_cfg)
    out = {_rename(k, _ROBERTA_NAMES): v for k, v in tensors.items()}
    if _BERT_POSITIONS in out:  # rows below the offset belong to padding / nothing
        out[_BERT_POSITIONS] = out[_BERT_POSITIONS][offset:]
    out.pop("bert.embeddings.token_type_ids", None)  # a buffer some versions save
    return out


def _bert_to_roberta(hf_cfg: dict, tensors: dict) -> dict:
    back = tuple((new, old) for old, new in _ROBERTA_NAMES)
    out = {_rename(k, back): v for k, v in tensors.items()}
    positions = out[_ROBERTA_POSITIONS]
    out[_ROBERTA_POSITIONS] = np.concatenate(
        [np.zeros((_roberta_offset(hf_cfg), positions.shape[1]), positions.dtype), positions])
    return out


# ----------------------------------------------------------------------------- configs


def _fill_encoder(cfg, hf_cfg: dict, tensors, family: str) -> None:
    """``tensors`` decides the optional heads (pooler, NSP); None: BertForPreTraining's both."""
    g, m = hf_cfg.get, cfg.model
    m.ffn = ffn_from_table(g("hidden_act", "gelu"), ACT_IN, g("hidden_act", "gelu"))
    if g("position_embedding_type", "absolute") != "absolute":
        raise UserError("only BERT with position_embedding_type='absolute' is supported.")
    if g("is_decoder") or g("add_cross_attention"):
        raise UserError("BERT as a decoder (is_decoder / add_cross_attention) is not "
                        "supported; convert an encoder BertForPreTraining.")
    m.architecture = "encoder_only"
    m.vocab_size, m.d_model = g("vocab_size", 30522), g("hidden_size", 768)
    m.num_heads = g("num_attention_heads", 12)
    m.head_dim = m.d_model // m.num_heads
    m.d_ff, m.num_encoder_layers = g("intermediate_size", 3072), g("num_hidden_layers", 12)
    m.num_decoder_layers = 0
    m.norm, m.norm_eps = "layernorm", g("layer_norm_eps", 1e-12)
    m.pre_norm, m.use_bias = False, True
    m.position, m.max_length = "learned", g("max_position_embeddings", 512)
    m.num_token_types = g("type_vocab_size", 2)
    if family == "roberta":
        m.max_length -= _roberta_offset(hf_cfg)
        m.hf_class = "RobertaForMaskedLM"
        tensors = tensors if tensors is not None else {}
    if family == "electra":  # no pooler, NSP or MLM head; embeddings may be narrower
        embedding_size = g("embedding_size", m.d_model)
        m.embed_dim = 0 if embedding_size == m.d_model else embedding_size
        m.electra.rtd_head = True
        tensors = {}
    if tensors is None:
        tensors = {_NSP: 1, _POOLER: 1}
    m.nsp_head = _NSP in tensors
    m.pooler = m.nsp_head or _POOLER in tensors
    m.dropout_rate = float(g("hidden_dropout_prob", 0.1))
    m.tie_embeddings = g("tie_word_embeddings", True) is not False
    m.scale_attn_logits, m.embed_norm, m.scale_tied_logits = True, True, False
    m.init_std = float(g("initializer_range", 0.02))
    cfg.data.feature_lengths = {"inputs": min(512, m.max_length)}


def _encoder_config(m) -> dict:
    """The config.json keys BERT, RoBERTa and ELECTRA share."""
    return {
        "vocab_size": m.vocab_size, "hidden_size": m.d_model,
        "num_hidden_layers": m.num_encoder_layers, "num_attention_heads": m.num_heads,
        "intermediate_size": m.d_ff, "hidden_act": ACT_OUT[m.ffn],
        "hidden_dropout_prob": m.dropout_rate, "attention_probs_dropout_prob": m.dropout_rate,
        "max_position_embeddings": m.max_length, "type_vocab_size": m.num_token_types,
        "initializer_range": m.init_std or 0.02, "layer_norm_eps": m.norm_eps,
        "pad_token_id": 0, "position_embedding_type": "absolute",
    }


def _bert_config_to_hf(m) -> dict:
    return {**_encoder_config(m),
            "architectures": ["BertForPreTraining" if m.nsp_head else "BertForMaskedLM"],
            "model_type": "bert", "tie_word_embeddings": m.tie_embeddings}


def _roberta_config_to_hf(m) -> dict:  # pad 1, <s> 0, </s> 2; positions from pad + 1
    return {**_encoder_config(m),
            "architectures": ["RobertaForMaskedLM"], "model_type": "roberta",
            "max_position_embeddings": m.max_length + 2,
            "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
            "tie_word_embeddings": m.tie_embeddings}


def _electra_config_to_hf(m) -> dict:
    return {**_encoder_config(m),
            "architectures": ["ElectraForPreTraining"], "model_type": "electra",
            "embedding_size": m.embed_dim or m.d_model}


# ----------------------------------------------------------------------------- tensor rules


def _encoder_rules(m, prefix: str) -> list:
    """Embeddings (width embed_dim or d_model, + ELECTRA's embeddings_project) and layers."""
    d, f, v, w = m.d_model, m.d_ff, m.vocab_size, m.embed_dim or m.d_model
    e = f"{prefix}.embeddings"
    rules = [Rule(("token_embedder", "embedding"), f"{e}.word_embeddings.weight", (v, w)),
             Rule(("encoder", "position_embedder", "embedding"),
                  f"{e}.position_embeddings.weight", (m.max_length, w)),
             Rule(("encoder", "token_type_embedder", "embedding"),
                  f"{e}.token_type_embeddings.weight", (m.num_token_types, w))]
    rules += norm_rules(("encoder", "embed_norm"), f"{e}.LayerNorm", w)
    if w != d:
        rules += linear_rules(("encoder", "embed_project"), f"{prefix}.embeddings_project", w, d,
                              bias=True)
    for i in range(m.num_encoder_layers):
        b, p = f"{prefix}.encoder.layer.{i}", ("encoder", "layers")
        for name in ("query", "key", "value"):
            rules += linear_rules(p + ("attention", name), f"{b}.attention.self.{name}", d, d, i,
                                  True)
        rules += linear_rules(p + ("attention", "out"), f"{b}.attention.output.dense", d, d, i,
                              True)
        rules += norm_rules(p + ("post_attention_layer_norm",),
                            f"{b}.attention.output.LayerNorm", d, i)
        rules += linear_rules(p + ("mlp", "wi"), f"{b}.intermediate.dense", d, f, i, True)
        rules += linear_rules(p + ("mlp", "wo"), f"{b}.output.dense", f, d, i, True)
        rules += norm_rules(p + ("post_mlp_layer_norm",), f"{b}.output.LayerNorm", d, i)
    return rules


def _bert_rules(m) -> tuple[list, set]:
    d, v = m.d_model, m.vocab_size
    rules = _encoder_rules(m, "bert")
    if m.pooler:
        rules += linear_rules(("pooler",), "bert.pooler.dense", d, d, bias=True)
    rules += linear_rules(("mlm_dense",), "cls.predictions.transform.dense", d, d, bias=True)
    rules += norm_rules(("mlm_norm",), "cls.predictions.transform.LayerNorm", d)
    rules.append(Rule(("mlm_bias",), "cls.predictions.bias", (v,)))
    if m.nsp_head:
        rules += linear_rules(("nsp_dense",), "cls.seq_relationship", d, 2, bias=True)
    ignorable = {"bert.embeddings.position_ids", "cls.predictions.decoder.bias"}
    if m.tie_embeddings:
        ignorable.add("cls.predictions.decoder.weight")
    else:
        rules += linear_rules(("logits_dense",), "cls.predictions.decoder", d, v)
    return rules, ignorable


def _electra_rules(m) -> tuple[list, set]:
    """ElectraForPreTraining: the discriminator; its head is HF ElectraDiscriminatorPredictions."""
    d = m.d_model
    rules = _encoder_rules(m, "electra")
    rules += linear_rules(("rtd_dense",), "discriminator_predictions.dense", d, d, bias=True)
    rules += linear_rules(("rtd_logits",), "discriminator_predictions.dense_prediction", d, 1,
                          bias=True)
    return rules, {"electra.embeddings.position_ids", "electra.embeddings.token_type_ids"}


def _bert_fix_exported(m, hf_cfg: dict, tensors: dict) -> dict:
    if not m.tie_embeddings:
        tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"].copy()
    return tensors


def _roberta_fix_exported(m, hf_cfg: dict, tensors: dict) -> dict:
    return _bert_to_roberta(hf_cfg, _bert_fix_exported(m, hf_cfg, tensors))


def _discriminator(m, params: dict) -> tuple:
    """A model with a generator exports its discriminator: the generator is left out."""
    if not m.electra.generator_d_model:
        return m, params
    m = dataclasses.replace(m, electra=dataclasses.replace(m.electra, generator_d_model=0))
    return m, {k: v for k, v in params.items() if not k.startswith("generator")}


def _masked_lm(m, params: dict) -> tuple:
    """BertForMaskedLM has no pooler: without the NSP head (and export refuses class heads)
    nothing trained it, so it is left out rather than written as keys transformers reports
    unexpected."""
    if not m.pooler or m.nsp_head:
        return m, params
    return dataclasses.replace(m, pooler=False), {k: v for k, v in params.items()
                                                  if k != "pooler"}


def _encoder_export_problems(m) -> list:
    return narrow_embedding_problems(m) + head_split_problems(m)


_EXPORT_NEEDS = dict(architecture="encoder_only", norm="layernorm", pre_norm=False,
                     use_bias=True, position="learned", embed_norm=True, scale_attn_logits=True,
                     num_classes=0)
_TIED_HEAD = ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight")

BERT = Family(
    name="bert", config_to_hf=_bert_config_to_hf, rules=_bert_rules,
    fill_config=functools.partial(_fill_encoder, family="bert"),
    export_needs=_EXPORT_NEEDS, ffn_out=ACT_OUT, tied_head=_TIED_HEAD,
    export_problems=_encoder_export_problems, fix_exported=_bert_fix_exported,
    exported_model=_masked_lm)

ROBERTA = Family(
    name="roberta", config_to_hf=_roberta_config_to_hf, rules=_bert_rules,
    fill_config=functools.partial(_fill_encoder, family="roberta"),
    export_needs=dict(_EXPORT_NEEDS, nsp_head=False, pooler=False), ffn_out=ACT_OUT,
    tied_head=_TIED_HEAD, names_from_hf=_roberta_to_bert,
    export_problems=_encoder_export_problems, fix_exported=_roberta_fix_exported)

ELECTRA = Family(
    name="electra", config_to_hf=_electra_config_to_hf, rules=_electra_rules,
    fill_config=functools.partial(_fill_encoder, family="electra"),
    export_needs=dict(_EXPORT_NEEDS, nsp_head=False, pooler=False, hf_class=""),
    ffn_out=ACT_OUT, export_problems=head_split_problems, exported_model=_discriminator)
