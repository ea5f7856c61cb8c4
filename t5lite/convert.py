"""Import / export Hugging Face T5, BERT, GPT-2, RoBERTa and ELECTRA checkpoints (local dirs only).

Supported HF classes: T5ForConditionalGeneration (v1.0: relu, tied and rescaled LM head; v1.1:
gated-gelu, untied), BertForPreTraining (MLM + NSP heads, pooler, token types; also
BertForMaskedLM, which many BERT checkpoints name while holding the NSP head too) and
GPT2LMHeadModel; RobertaForMaskedLM (BERT layers without NSP / pooler; HF numbers positions
from padding_idx + 1, so t5lite's position p is HF's row p + padding_idx + 1; exported with
``model.hf_class="RobertaForMaskedLM"``. RoBERTa's <s> is id 0, t5lite's padding id: give
``encoder_segment_ids`` (as seqio's converters do; 0 = padding) and the encoder takes padding
from them, so <s> is a real token; without segment ids token 0 is padding) and
ElectraForPreTraining (the discriminator: BERT layers, embeddings of width embedding_size with
HF's embeddings_project, RTD head; a t5lite ELECTRA with a generator exports its discriminator
only). ``hf_to_t5lite`` maps the HF
config.json onto a t5lite Config and every HF tensor onto the t5lite parameter tree (layout:
t5lite/models/architectures.py docstring), for ``scan_layers`` True (layers stacked on a
leading axis) or False (``layers_0 ...``).
``t5lite_to_hf`` writes config.json + model.safetensors that ``from_pretrained`` loads.

The mapping is one table of Rules per family: a t5lite path, an HF tensor name and its HF shape,
whether HF stores it transposed (torch Linear: [out, in]) and, for GPT-2's fused c_attn, which
third of it. Reshapes are row-major on both sides (HF splits heads as [H * K] = H-major), so
export is the exact inverse of import. Every t5lite leaf must be produced and every HF tensor
consumed (or be a known tied copy), so an unsupported variant fails loudly, never silently.
Nothing here touches the network: only files in the given directory are read.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import numpy as np
from flax import traverse_util

from t5lite import config as config_lib
from t5lite.errors import UserError

SUPPORTED = {
    "T5ForConditionalGeneration": "t5",
    "BertForPreTraining": "bert",
    "BertForMaskedLM": "bert",  # heads present in the file decide (pooler / NSP optional)
    "GPT2LMHeadModel": "gpt2",
    "RobertaForMaskedLM": "roberta",  # the BERT rules on renamed tensors (_roberta_to_bert)
    "ElectraForPreTraining": "electra",  # the discriminator (BERT layers + RTD head)
}
_BY_MODEL_TYPE = {"t5": "T5ForConditionalGeneration", "bert": "BertForPreTraining",
                  "gpt2": "GPT2LMHeadModel", "roberta": "RobertaForMaskedLM",
                  "electra": "ElectraForPreTraining"}
# RoBERTa tensor names -> BERT's (prefix and LM head)
_ROBERTA_NAMES = (("roberta.", "bert."), ("lm_head.dense.", "cls.predictions.transform.dense."),
                  ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
                  ("lm_head.decoder.", "cls.predictions.decoder."),
                  ("lm_head.bias", "cls.predictions.bias"))
_POS = "bert.embeddings.position_embeddings.weight"


def _roberta_offset(hf_cfg: dict) -> int:
    return int(hf_cfg.get("pad_token_id", 1)) + 1


def _roberta_to_bert(tensors: dict, offset: int) -> dict:
    out = {}
    for k, v in tensors.items():
        for a, b in _ROBERTA_NAMES:
            if k.startswith(a):
                k = b + k[len(a):]
                break
        out[k] = v
    if _POS in out:  # rows below the offset belong to padding / nothing
        out[_POS] = out[_POS][offset:]
    out.pop("bert.embeddings.token_type_ids", None)  # a buffer some versions save
    return out


def _bert_to_roberta(tensors: dict, offset: int) -> dict:
    out = {}
    for k, v in tensors.items():
        for a, b in _ROBERTA_NAMES:
            if k.startswith(b):
                k = a + k[len(b):]
                break
        out[k] = v
    pos = out["roberta.embeddings.position_embeddings.weight"]
    out["roberta.embeddings.position_embeddings.weight"] = np.concatenate(
        [np.zeros((offset, pos.shape[1]), pos.dtype), pos])
    return out

# HF activation names <-> t5lite ffn names (non-gated / gated T5 feed-forward).
_ACT_IN = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
           "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}
_GATED_IN = {"gelu": "geglu", "gelu_new": "geglu", "gelu_pytorch_tanh": "geglu",
             "relu": "reglu", "silu": "swiglu", "swish": "swiglu", "sigmoid": "glu",
             "linear": "bilinear"}
_ACT_OUT = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}
_T5_FFN_OUT = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu",
               "geglu": "gated-gelu", "reglu": "gated-relu", "swiglu": "gated-silu",
               "glu": "gated-sigmoid", "bilinear": "gated-linear"}


# ----------------------------------------------------------------------------- reading HF dirs


def read_hf_dir(hf_dir: str) -> tuple[dict, dict]:
    """-> (config.json as a dict, {tensor name: float32 numpy array}) from a local HF dir."""
    if not os.path.isdir(hf_dir):
        raise UserError(f"{hf_dir} is not a directory; pass a local Hugging Face model dir "
                        "(config.json + model.safetensors). Hub names are not downloaded: "
                        "fetch the model first, e.g. with `hf download NAME --local-dir DIR`.")
    cfg_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(cfg_path):
        raise UserError(f"{hf_dir} has no config.json; it must be a Hugging Face model dir "
                        "written by save_pretrained (config.json + model.safetensors).")
    return read_hf_config(hf_dir), _read_tensors(hf_dir)


def _read_tensors(hf_dir: str) -> dict:
    files = set(os.listdir(hf_dir))
    for index, fmt in (("model.safetensors.index.json", "safetensors"),
                       ("pytorch_model.bin.index.json", "torch")):
        if index in files:  # sharded checkpoint
            try:
                with open(os.path.join(hf_dir, index)) as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise UserError(f"{os.path.join(hf_dir, index)} is malformed ({type(e).__name__}:"
                                f" {e}); it must be JSON with a weight_map") from None
            out = {}
            for shard in shards:
                out.update(_read_file(os.path.join(hf_dir, shard), fmt))
            return out
    if "model.safetensors" in files:
        return _read_file(os.path.join(hf_dir, "model.safetensors"), "safetensors")
    if "pytorch_model.bin" in files:
        return _read_file(os.path.join(hf_dir, "pytorch_model.bin"), "torch")
    raise UserError(f"{hf_dir} has no weights: expected model.safetensors or pytorch_model.bin "
                    f"(found {', '.join(sorted(files)) or 'nothing'}). TF / Flax weights: load "
                    "them in transformers and save_pretrained(..., safe_serialization=True).")


def _read_file(path: str, fmt: str) -> dict:
    if not os.path.isfile(path):
        raise UserError(f"weights file {path} is missing; re-save the model with "
                        "save_pretrained")
    try:
        return _read_weights(path, fmt)
    except (UserError, ImportError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - truncated, garbage, wrong format ...
        first = (str(e).splitlines() or [""])[0][:160]
        raise UserError(f"{path} is not a readable {fmt} weights file ({type(e).__name__}: "
                        f"{first}); re-download it or re-save the model with "
                        "save_pretrained") from None


def _read_weights(path: str, fmt: str) -> dict:
    if fmt == "torch":
        try:
            import torch
        except ImportError as e:
            raise UserError(f"reading {path} needs PyTorch; `pip install torch` or convert it to "
                            "model.safetensors with transformers first.") from e
        state = torch.load(path, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    from safetensors import safe_open
    out = {}
    with safe_open(path, framework="numpy") as f:
        names = list(f.keys())
        bf16 = [n for n in names if f.get_slice(n).get_dtype() == "BF16"]
        for n in names:
            if n not in bf16:
                out[n] = np.asarray(f.get_tensor(n), np.float32)
    if bf16:  # numpy has no bfloat16: read those through jax (ml_dtypes) on the CPU
        import jax
        with jax.default_device(jax.devices("cpu")[0]), safe_open(path, framework="flax") as f:
            for n in bf16:
                out[n] = np.asarray(f.get_tensor(n), np.float32)
    return out


def hf_architecture(hf_cfg: dict) -> str:
    archs = hf_cfg.get("architectures") or []
    if not archs and hf_cfg.get("model_type") in _BY_MODEL_TYPE:
        archs = [_BY_MODEL_TYPE[hf_cfg["model_type"]]]
    for a in archs:
        if a in SUPPORTED:
            return a
    raise UserError(f"unsupported architecture {archs or hf_cfg.get('model_type')}: t5lite "
                    f"converts {', '.join(SUPPORTED)}. Load the model in transformers as one "
                    "of these classes and save_pretrained it, or train it in t5lite.")


def _normalize_names(family: str, tensors: dict) -> dict:
    """Accept older / base-model spellings: LayerNorm gamma/beta, GPT-2 without 'transformer.'."""
    out = {}
    for k, v in tensors.items():
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                     "LayerNorm.bias")
        if family == "gpt2" and not k.startswith(("transformer.", "lm_head.")):
            k = "transformer." + k
        if family == "t5" and k == "encoder.embed_tokens.weight" and "shared.weight" not in tensors:
            k = "shared.weight"
        out[k] = v
    return out


# ----------------------------------------------------------------------------- configs


def _ffn_from_hf(family: str, hf_cfg: dict) -> str:
    if family == "t5":
        proj = hf_cfg.get("feed_forward_proj", "relu")
        gated, act = proj.startswith("gated-"), proj.split("-")[-1]
        table = _GATED_IN if gated else _ACT_IN
    else:
        bert = family in ("bert", "roberta", "electra")
        act = hf_cfg.get("hidden_act" if bert else "activation_function",
                         "gelu" if bert else "gelu_new")
        table, proj = _ACT_IN, act
    if not isinstance(act, str) or act not in table:
        raise UserError(f"activation {proj!r} has no t5lite equivalent; supported: "
                        f"{', '.join(sorted(table))}.")
    return table[act]


def _t5_scales_logits(hf_cfg: dict) -> bool:
    """transformers 5.x: scale_decoder_outputs, else (older configs) tie_word_embeddings."""
    return bool(hf_cfg.get("scale_decoder_outputs", hf_cfg.get("tie_word_embeddings", True)
                           is not False))


def config_from_hf(hf_cfg: dict, tensors: Optional[dict] = None,
                   scan_layers: bool = True) -> config_lib.Config:
    """A t5lite Config whose ModelConfig reproduces the HF model (``tensors`` decides T5
    tying: a T5 lm_head that differs from the embedding means untied)."""
    arch = hf_architecture(hf_cfg)
    family = SUPPORTED[arch]
    g = hf_cfg.get
    cfg = config_lib.Config(name=f"hf_{family}")
    m = cfg.model
    m.scan_layers = scan_layers
    m.ffn = _ffn_from_hf(family, hf_cfg)
    if family == "t5":
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
        scaled = _t5_scales_logits(hf_cfg)
        m.tie_embeddings = scaled and not _t5_has_own_head(tensors or {})
        m.scale_tied_logits = m.tie_embeddings
        cfg.data.feature_lengths = {"inputs": 512, "targets": 114}
    elif family in ("bert", "roberta", "electra"):
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
            e = g("embedding_size", m.d_model)
            m.embed_dim = 0 if e == m.d_model else e
            m.electra.rtd_head = True
            tensors = {}
        if tensors is None:  # no weights to look at: BertForPreTraining has both heads
            tensors = {"cls.seq_relationship.weight": 1, "bert.pooler.dense.weight": 1}
        m.nsp_head = "cls.seq_relationship.weight" in tensors
        m.pooler = m.nsp_head or "bert.pooler.dense.weight" in tensors
        m.dropout_rate = float(g("hidden_dropout_prob", 0.1))
        m.tie_embeddings = g("tie_word_embeddings", True) is not False
        m.scale_attn_logits, m.embed_norm, m.scale_tied_logits = True, True, False
        m.init_std = float(g("initializer_range", 0.02))
        cfg.data.feature_lengths = {"inputs": min(512, m.max_length)}
    else:  # gpt2
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
    config_lib.validate(cfg)
    return cfg


def _t5_has_own_head(tensors: dict) -> bool:
    head, emb = tensors.get("lm_head.weight"), tensors.get("shared.weight")
    return head is not None and not (emb is not None and np.array_equal(head, emb))


def family_of(m) -> str:
    """Which HF family a t5lite ModelConfig exports to (UserError if none fits)."""
    want = {
        "t5": dict(architecture="encoder_decoder", norm="rmsnorm", pre_norm=True, use_bias=False,
                   position="relative", shared_encoder_decoder=False, embed_norm=False,
                   scale_attn_logits=False, num_classes=0),
        "bert": dict(architecture="encoder_only", norm="layernorm", pre_norm=False, use_bias=True,
                     position="learned", embed_norm=True, scale_attn_logits=True,
                     num_classes=0),
        "gpt2": dict(architecture="decoder_only", norm="layernorm", pre_norm=True, use_bias=True,
                     position="learned", embed_norm=False, scale_attn_logits=True, num_classes=0),
    }
    fam = {"encoder_decoder": "t5", "encoder_only": "bert", "decoder_only": "gpt2"}.get(
        m.architecture)
    if fam is None:
        raise UserError(f"architecture {m.architecture!r} has no Hugging Face counterpart here; "
                        "export supports encoder_decoder (T5), encoder_only (BERT) and "
                        "decoder_only (GPT-2).")
    if m.hf_class == "RobertaForMaskedLM":
        fam = "roberta"
        want["roberta"] = dict(want["bert"], nsp_head=False, pooler=False)
    if fam == "bert" and m.electra.rtd_head:  # the discriminator (a generator is left out)
        fam = "electra"
        want["electra"] = dict(want["bert"], nsp_head=False, pooler=False, hf_class="")

    bad = [f"{k}={getattr(m, k)!r} (needs {v!r})" for k, v in want[fam].items()
           if getattr(m, k) != v]
    if m.embed_dim and fam != "electra":
        bad.append(f"embed_dim={m.embed_dim} (only ELECTRA exports a narrower embedding)")
    if fam != "t5" and m.d_model != m.num_heads * m.head_dim:
        bad.append(f"d_model={m.d_model} != num_heads*head_dim={m.num_heads * m.head_dim}")
    if fam == "gpt2" and m.tie_embeddings and m.scale_tied_logits:
        bad.append("scale_tied_logits=True (GPT-2's tied head is not rescaled)")
    ffns = _T5_FFN_OUT if fam == "t5" else _ACT_OUT
    if m.hf_class not in ("", "RobertaForMaskedLM"):
        bad.append(f"hf_class={m.hf_class!r} (needs '' or 'RobertaForMaskedLM')")
    if m.ffn not in ffns:
        bad.append(f"ffn={m.ffn!r} (needs one of {', '.join(ffns)})")
    if _peft_on(m):
        bad.append("PEFT parameters present (LoRA: merge it first with `t5lite convert "
                   "merge-lora SRC MERGED`; prompts, prefixes, adapters and (IA)^3 have no Hugging "
                   "Face counterpart)")
    if bad:
        raise UserError(f"this model cannot be exported as {fam}: " + "; ".join(bad) + ".")
    return fam


def _peft_on(m) -> bool:
    p = m.peft
    return bool(p.lora_rank or p.prompt_tokens or p.prefix_tokens or p.adapter_dim or p.ia3)


def config_to_hf(m) -> dict:
    """The HF config.json for a t5lite ModelConfig."""
    fam = family_of(m)
    if fam == "t5":
        scaled = m.tie_embeddings and m.scale_tied_logits
        return {
            "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
            "vocab_size": m.vocab_size, "d_model": m.d_model, "d_kv": m.head_dim, "d_ff": m.d_ff,
            "num_layers": m.num_encoder_layers, "num_decoder_layers": m.num_decoder_layers,
            "num_heads": m.num_heads, "relative_attention_num_buckets": m.relative_buckets,
            "relative_attention_max_distance": m.relative_max_distance,
            "dropout_rate": m.dropout_rate, "layer_norm_epsilon": m.norm_eps,
            "feed_forward_proj": _T5_FFN_OUT[m.ffn], "is_encoder_decoder": True,
            # transformers < 5 reads tie_word_embeddings; 5.x reads scale_decoder_outputs.
            "tie_word_embeddings": scaled, "scale_decoder_outputs": scaled,
            "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
            "initializer_factor": 1.0, "use_cache": True,
        }
    if fam == "roberta":  # pad 1, <s> 0, </s> 2; positions from pad + 1
        return {
            "architectures": ["RobertaForMaskedLM"], "model_type": "roberta",
            "vocab_size": m.vocab_size, "hidden_size": m.d_model,
            "num_hidden_layers": m.num_encoder_layers, "num_attention_heads": m.num_heads,
            "intermediate_size": m.d_ff, "hidden_act": _ACT_OUT[m.ffn],
            "hidden_dropout_prob": m.dropout_rate, "attention_probs_dropout_prob": m.dropout_rate,
            "max_position_embeddings": m.max_length + 2, "type_vocab_size": m.num_token_types,
            "initializer_range": m.init_std or 0.02, "layer_norm_eps": m.norm_eps,
            "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
            "position_embedding_type": "absolute", "tie_word_embeddings": m.tie_embeddings,
        }
    if fam == "electra":
        return {
            "architectures": ["ElectraForPreTraining"], "model_type": "electra",
            "vocab_size": m.vocab_size, "embedding_size": m.embed_dim or m.d_model,
            "hidden_size": m.d_model, "num_hidden_layers": m.num_encoder_layers,
            "num_attention_heads": m.num_heads, "intermediate_size": m.d_ff,
            "hidden_act": _ACT_OUT[m.ffn], "hidden_dropout_prob": m.dropout_rate,
            "attention_probs_dropout_prob": m.dropout_rate,
            "max_position_embeddings": m.max_length, "type_vocab_size": m.num_token_types,
            "initializer_range": m.init_std or 0.02, "layer_norm_eps": m.norm_eps,
            "pad_token_id": 0, "position_embedding_type": "absolute",
        }
    if fam == "bert":
        return {
            "architectures": ["BertForPreTraining" if m.nsp_head else "BertForMaskedLM"],
            "model_type": "bert",
            "vocab_size": m.vocab_size, "hidden_size": m.d_model,
            "num_hidden_layers": m.num_encoder_layers, "num_attention_heads": m.num_heads,
            "intermediate_size": m.d_ff, "hidden_act": _ACT_OUT[m.ffn],
            "hidden_dropout_prob": m.dropout_rate, "attention_probs_dropout_prob": m.dropout_rate,
            "max_position_embeddings": m.max_length, "type_vocab_size": m.num_token_types,
            "initializer_range": m.init_std or 0.02, "layer_norm_eps": m.norm_eps,
            "pad_token_id": 0, "position_embedding_type": "absolute",
            "tie_word_embeddings": m.tie_embeddings,
        }
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": m.vocab_size, "n_positions": m.max_length, "n_embd": m.d_model,
        "n_layer": m.num_decoder_layers, "n_head": m.num_heads, "n_inner": m.d_ff,
        "activation_function": _ACT_OUT[m.ffn], "resid_pdrop": m.dropout_rate,
        "embd_pdrop": m.dropout_rate, "attn_pdrop": m.dropout_rate,
        "layer_norm_epsilon": m.norm_eps, "initializer_range": m.init_std or 0.02,
        "scale_attn_weights": True, "tie_word_embeddings": m.tie_embeddings,
        "bos_token_id": m.vocab_size - 1, "eos_token_id": m.vocab_size - 1,
    }


# ----------------------------------------------------------------------------- mapping rules


@dataclasses.dataclass(frozen=True)
class Rule:
    """One t5lite leaf <-> one HF tensor (or one third of GPT-2's fused c_attn)."""

    path: tuple  # t5lite path; a "layers" element is the layer stack
    hf: str  # HF tensor name
    hf_shape: tuple  # shape of the HF tensor (of its piece, when split)
    transpose: bool = False  # HF stores it [out, in] (torch Linear) or [buckets, heads]
    layer: Optional[int] = None  # index into the layer stack
    split: Optional[tuple] = None  # (piece, pieces) along the HF tensor's last axis


def _linear(path, hf, n_in, n_out, layer=None, bias=False):
    """torch Linear [out, in] (+ bias [out]) <-> t5lite DenseGeneral kernel (+ bias)."""
    rules = [Rule(path + ("kernel",), hf + ".weight", (n_out, n_in), True, layer)]
    if bias:
        rules.append(Rule(path + ("bias",), hf + ".bias", (n_out,), False, layer))
    return rules


def _conv1d(path, hf, n_in, n_out, layer, split=None):
    """GPT-2 Conv1D: weight already [in, out]."""
    w_shape = (n_in, n_out)
    return [Rule(path + ("kernel",), hf + ".weight", w_shape, False, layer, split),
            Rule(path + ("bias",), hf + ".bias", (n_out,), False, layer, split)]


def _norm(path, hf, d, layer=None, bias=True):
    rules = [Rule(path + ("scale",), hf + ".weight", (d,), False, layer)]
    if bias:
        rules.append(Rule(path + ("bias",), hf + ".bias", (d,), False, layer))
    return rules


def _t5_rules(m) -> tuple[list, set]:
    d, hk, f, v = m.d_model, m.num_heads * m.head_dim, m.d_ff, m.vocab_size
    gated = m.ffn in ("geglu", "reglu", "swiglu", "glu", "bilinear")
    rules = [Rule(("token_embedder", "embedding"), "shared.weight", (v, d))]

    def attn(stack, name, hf, i):
        return sum((_linear((stack, "layers", name, t5), f"{hf}.{h}", d, hk, i)
                    for t5, h in (("query", "q"), ("key", "k"), ("value", "v"))), []) + \
            _linear((stack, "layers", name, "out"), f"{hf}.o", hk, d, i)

    def mlp(stack, hf, i):
        names = (("wi_0", "wi_0"), ("wi_1", "wi_1")) if gated else (("wi", "wi"),)
        out = sum((_linear((stack, "layers", "mlp", t5), f"{hf}.DenseReluDense.{h}", d, f, i)
                   for t5, h in names), [])
        return out + _linear((stack, "layers", "mlp", "wo"), f"{hf}.DenseReluDense.wo", f, d, i)

    for stack, n in (("encoder", m.num_encoder_layers), ("decoder", m.num_decoder_layers)):
        rules.append(Rule((stack, "relpos_bias", "rel_embedding"),
                          f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                          (m.relative_buckets, m.num_heads), True))
        for i in range(n):
            b = f"{stack}.block.{i}.layer"
            if stack == "encoder":
                rules += _norm((stack, "layers", "pre_attention_layer_norm"),
                               f"{b}.0.layer_norm", d, i, bias=False)
                rules += attn(stack, "attention", f"{b}.0.SelfAttention", i)
                rules += _norm((stack, "layers", "pre_mlp_layer_norm"), f"{b}.1.layer_norm", d, i,
                               bias=False)
                rules += mlp(stack, f"{b}.1", i)
            else:
                rules += _norm((stack, "layers", "pre_self_attention_layer_norm"),
                               f"{b}.0.layer_norm", d, i, bias=False)
                rules += attn(stack, "self_attention", f"{b}.0.SelfAttention", i)
                rules += _norm((stack, "layers", "pre_cross_attention_layer_norm"),
                               f"{b}.1.layer_norm", d, i, bias=False)
                rules += attn(stack, "encoder_decoder_attention", f"{b}.1.EncDecAttention", i)
                rules += _norm((stack, "layers", "pre_mlp_layer_norm"), f"{b}.2.layer_norm", d, i,
                               bias=False)
                rules += mlp(stack, f"{b}.2", i)
        rules += _norm((stack, f"{stack}_norm"), f"{stack}.final_layer_norm", d, bias=False)
    if not m.tie_embeddings:
        rules += _linear(("decoder", "logits_dense"), "lm_head", d, v)
    ignorable = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                 "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"}
    if m.tie_embeddings:
        ignorable.add("lm_head.weight")  # a copy of shared.weight (checked on import)
    return rules, ignorable


def _bert_encoder_rules(m, prefix: str) -> list:
    """Embeddings (width embed_dim or d_model, + ELECTRA's embeddings_project) and layers."""
    d, f, v, w = m.d_model, m.d_ff, m.vocab_size, m.embed_dim or m.d_model
    e = f"{prefix}.embeddings"
    rules = [Rule(("token_embedder", "embedding"), f"{e}.word_embeddings.weight", (v, w)),
             Rule(("encoder", "position_embedder", "embedding"),
                  f"{e}.position_embeddings.weight", (m.max_length, w)),
             Rule(("encoder", "token_type_embedder", "embedding"),
                  f"{e}.token_type_embeddings.weight", (m.num_token_types, w))]
    rules += _norm(("encoder", "embed_norm"), f"{e}.LayerNorm", w)
    if w != d:
        rules += _linear(("encoder", "embed_project"), f"{prefix}.embeddings_project", w, d,
                         bias=True)
    for i in range(m.num_encoder_layers):
        b, p = f"{prefix}.encoder.layer.{i}", ("encoder", "layers")
        for name in ("query", "key", "value"):
            rules += _linear(p + ("attention", name), f"{b}.attention.self.{name}", d, d, i, True)
        rules += _linear(p + ("attention", "out"), f"{b}.attention.output.dense", d, d, i, True)
        rules += _norm(p + ("post_attention_layer_norm",), f"{b}.attention.output.LayerNorm", d, i)
        rules += _linear(p + ("mlp", "wi"), f"{b}.intermediate.dense", d, f, i, True)
        rules += _linear(p + ("mlp", "wo"), f"{b}.output.dense", f, d, i, True)
        rules += _norm(p + ("post_mlp_layer_norm",), f"{b}.output.LayerNorm", d, i)
    return rules


def _electra_rules(m) -> tuple[list, set]:
    """ElectraForPreTraining: the discriminator; its head is HF ElectraDiscriminatorPredictions."""
    d = m.d_model
    rules = _bert_encoder_rules(m, "electra")
    rules += _linear(("rtd_dense",), "discriminator_predictions.dense", d, d, bias=True)
    rules += _linear(("rtd_logits",), "discriminator_predictions.dense_prediction", d, 1,
                     bias=True)
    return rules, {"electra.embeddings.position_ids", "electra.embeddings.token_type_ids"}


def _bert_rules(m) -> tuple[list, set]:
    d, v = m.d_model, m.vocab_size
    rules = _bert_encoder_rules(m, "bert")
    if m.pooler:
        rules += _linear(("pooler",), "bert.pooler.dense", d, d, bias=True)
    rules += _linear(("mlm_dense",), "cls.predictions.transform.dense", d, d, bias=True)
    rules += _norm(("mlm_norm",), "cls.predictions.transform.LayerNorm", d)
    rules.append(Rule(("mlm_bias",), "cls.predictions.bias", (v,)))
    if m.nsp_head:
        rules += _linear(("nsp_dense",), "cls.seq_relationship", d, 2, bias=True)
    ignorable = {"bert.embeddings.position_ids", "cls.predictions.decoder.bias"}
    if m.tie_embeddings:
        ignorable.add("cls.predictions.decoder.weight")
    else:
        rules += _linear(("logits_dense",), "cls.predictions.decoder", d, v)
    return rules, ignorable


def _gpt2_rules(m) -> tuple[list, set]:
    d, f, v = m.d_model, m.d_ff, m.vocab_size
    rules = [Rule(("token_embedder", "embedding"), "transformer.wte.weight", (v, d)),
             Rule(("decoder", "position_embedder", "embedding"), "transformer.wpe.weight",
                  (m.max_length, d))]
    ignorable = set()
    for i in range(m.num_decoder_layers):
        h, p = f"transformer.h.{i}", ("decoder", "layers")
        rules += _norm(p + ("pre_self_attention_layer_norm",), f"{h}.ln_1", d, i)
        for j, name in enumerate(("query", "key", "value")):
            rules += _conv1d(p + ("self_attention", name), f"{h}.attn.c_attn", d, d, i, (j, 3))
        rules += _conv1d(p + ("self_attention", "out"), f"{h}.attn.c_proj", d, d, i)
        rules += _norm(p + ("pre_mlp_layer_norm",), f"{h}.ln_2", d, i)
        rules += _conv1d(p + ("mlp", "wi"), f"{h}.mlp.c_fc", d, f, i)
        rules += _conv1d(p + ("mlp", "wo"), f"{h}.mlp.c_proj", f, d, i)
        ignorable |= {f"{h}.attn.bias", f"{h}.attn.masked_bias"}  # causal-mask buffers
    rules += _norm(("decoder", "decoder_norm"), "transformer.ln_f", d)
    if m.tie_embeddings:
        ignorable.add("lm_head.weight")
    else:
        rules += _linear(("decoder", "logits_dense"), "lm_head", d, v)
    return rules, ignorable


_RULES = {"t5": _t5_rules, "bert": _bert_rules, "gpt2": _gpt2_rules, "electra": _electra_rules}


def _leaf_path(rule: Rule, scan: bool) -> tuple:
    if rule.layer is None or scan:
        return rule.path
    return tuple(f"layers_{rule.layer}" if p == "layers" else p for p in rule.path)


def _abstract_leaves(m) -> dict:
    """{path tuple: shape} of build_model(m).init's unboxed params (nothing allocated)."""
    import flax.linen as nn
    import jax

    from t5lite.models import abstract_params
    tree = nn.meta.unbox(abstract_params(m))
    return {tuple(k.key for k in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


# ----------------------------------------------------------------------------- import / export


def hf_to_t5lite(hf_dir: str, scan_layers: bool = True):
    """-> (Config, params): params is the unboxed float32 numpy pytree that
    ``build_model(cfg.model).init`` would produce, with the HF weights."""
    hf_cfg, tensors = read_hf_dir(hf_dir)
    family = SUPPORTED[hf_architecture(hf_cfg)]
    tensors = _normalize_names(family, tensors)
    if family == "roberta":
        tensors, family = _roberta_to_bert(tensors, _roberta_offset(hf_cfg)), "bert"
    try:
        cfg = config_from_hf(hf_cfg, tensors, scan_layers)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{hf_dir}/config.json is malformed for {family} ({type(e).__name__}: "
                        f"{e}); it must be the config.json save_pretrained wrote with these "
                        "weights") from None
    m = cfg.model
    if family == "t5" and not m.tie_embeddings:
        if "lm_head.weight" not in tensors:  # unscaled head saved as tied (transformers 5.x)
            tensors["lm_head.weight"] = tensors["shared.weight"]
        if _t5_scales_logits(hf_cfg):  # rescaled head with its own weights: fold the rescale
            tensors["lm_head.weight"] = tensors["lm_head.weight"] * np.float32(m.d_model ** -0.5)
    rules, ignorable = _RULES[family](m)
    want = _abstract_leaves(m)
    layers: dict = {}
    flat: dict = {}
    used = set()
    for r in rules:
        if r.hf not in tensors:
            raise UserError(f"{hf_dir}: tensor {r.hf} is missing; the weights do not match "
                            f"config.json ({hf_architecture(hf_cfg)}). Re-save the "
                            "model with transformers' save_pretrained.")
        x = tensors[r.hf]
        used.add(r.hf)
        if r.split is not None:
            if x.shape[-1] % r.split[1]:
                raise UserError(f"{r.hf} has shape {x.shape}; its last axis must split in "
                                f"{r.split[1]}")
            x = np.split(x, r.split[1], axis=-1)[r.split[0]]
        if tuple(x.shape) != tuple(r.hf_shape):
            raise UserError(f"{hf_dir}: {r.hf} has shape {tuple(x.shape)} but config.json implies "
                            f"{tuple(r.hf_shape)} (vocab_size / hidden sizes / layer counts); "
                            "fix config.json to match the weights.")
        path = _leaf_path(r, m.scan_layers)
        if path not in want:
            raise RuntimeError(f"convert rule for {path}: not a parameter of this model")
        x = x.T if r.transpose else x
        shape = want[path][1:] if (m.scan_layers and r.layer is not None) else want[path]
        x = np.ascontiguousarray(x, np.float32).reshape(shape)
        if m.scan_layers and r.layer is not None:
            layers.setdefault(path, {})[r.layer] = x
        else:
            flat[path] = x
    for path, per_layer in layers.items():
        flat[path] = np.stack([per_layer[i] for i in range(len(per_layer))])
    _check_tied(family, m, tensors, hf_dir)
    unused = sorted(set(tensors) - used - ignorable)
    if unused:
        raise UserError(f"{hf_dir}: {len(unused)} tensors have no t5lite counterpart (a different "
                        f"head or variant?): {', '.join(unused[:6])}. Supported: "
                        f"{', '.join(SUPPORTED)} as saved by transformers.")
    _check_complete(flat, want)
    return cfg, traverse_util.unflatten_dict(flat)


def _check_tied(family, m, tensors, hf_dir):
    """A 'tied' head stored in the file must equal the embedding, else we would drop it."""
    if family == "electra":  # no output layer
        return
    name, emb = {
        "t5": ("lm_head.weight", "shared.weight"),
        "bert": ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
        "gpt2": ("lm_head.weight", "transformer.wte.weight")}[family]
    if m.tie_embeddings and name in tensors and not np.array_equal(tensors[name], tensors[emb]):
        raise UserError(f"{hf_dir}: config.json ties the output layer to the embedding but "
                        f"{name} differs from {emb}; set tie_word_embeddings=false in "
                        "config.json if the model is untied.")


def _check_complete(flat: dict, want: dict):
    """Every model parameter produced with its shape (a failure here is a converter bug)."""
    missing = sorted(set(want) - set(flat))
    if missing:
        raise RuntimeError("convert: no HF tensor maps to "
                           + ", ".join("/".join(p) for p in missing[:6]))
    for path, shape in want.items():
        if flat[path].shape != shape:
            raise RuntimeError(f"convert: {'/'.join(path)} came out {flat[path].shape}, "
                               f"the model wants {shape}")


def t5lite_to_hf(cfg, params, out_dir: str) -> str:
    """Write ``out_dir/config.json`` + ``model.safetensors`` loadable by transformers'
    from_pretrained; returns out_dir. ``params``: the unboxed tree for ``cfg`` (Config or
    ModelConfig)."""
    from safetensors.numpy import save_file

    m = getattr(cfg, "model", cfg)
    family = family_of(m)
    hf_cfg = config_to_hf(m)
    if family == "electra" and m.electra.generator_d_model:  # export the discriminator
        m = dataclasses.replace(m, electra=dataclasses.replace(m.electra, generator_d_model=0))
        params = {k: v for k, v in params.items() if not k.startswith("generator")}
    roberta = family == "roberta"
    family = "bert" if roberta else family
    rules, _ = _RULES[family](m)
    flat = {p: np.asarray(v, np.float32)
            for p, v in traverse_util.flatten_dict(params).items()}
    want = _abstract_leaves(m)
    for path, shape in want.items():
        if path not in flat:
            raise UserError(f"params lack {'/'.join(path)}: they do not belong to this config "
                            "(check model.* in config.json, e.g. scan_layers, tie_embeddings).")
        if flat[path].shape != shape:
            raise UserError(f"param {'/'.join(path)} has shape {flat[path].shape} but the config "
                            f"implies {shape} (vocab_size / d_model / layers mismatch).")
    extra = sorted(set(flat) - set(want))
    if extra:
        raise UserError("params have entries this config does not define: "
                        + ", ".join("/".join(p) for p in extra[:6]))
    pieces: dict = {}
    for r in rules:
        x = flat[_leaf_path(r, m.scan_layers)]
        if m.scan_layers and r.layer is not None:
            x = x[r.layer]
        x = x.reshape(r.hf_shape[::-1] if r.transpose else r.hf_shape)
        x = x.T if r.transpose else x
        pieces.setdefault(r.hf, {})[r.split[0] if r.split else 0] = x
    tensors = {name: np.ascontiguousarray(
        np.concatenate([p[i] for i in range(len(p))], axis=-1) if len(p) > 1 else p[0])
        for name, p in pieces.items()}
    if family == "bert" and not m.tie_embeddings:
        tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"].copy()
    if family == "t5" and m.tie_embeddings and not m.scale_tied_logits:
        tensors["lm_head.weight"] = tensors["shared.weight"].copy()  # tied but unscaled
    if roberta:
        tensors = _bert_to_roberta(tensors, _roberta_offset(hf_cfg))
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2, sort_keys=True)
    return out_dir


# ----------------------------------------------------------------------------- HF config files


def read_hf_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            hf_cfg = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise UserError(f"{path} is not valid JSON ({e}); it must be the config.json that "
                        "save_pretrained wrote") from None
    if not isinstance(hf_cfg, dict):
        raise UserError(f"{path} holds a JSON {type(hf_cfg).__name__}, not an object; it must "
                        "be the config.json that save_pretrained wrote")
    return hf_cfg
