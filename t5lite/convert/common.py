"""The mapping machinery every family shares: Rule (one t5lite leaf <-> one HF tensor), the
builders for torch Linear / GPT-2 Conv1D / norm tensors, the activation-name tables and Family,
the set of hooks through which the generic import / export drivers reach one family's mapping.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from t5lite.errors import UserError

# HF activation names <-> t5lite ffn names (non-gated feed-forward).
ACT_IN = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
          "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}
ACT_OUT = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}


def ffn_from_table(act, table: dict, shown) -> str:
    """t5lite's ffn for HF activation ``act`` (``shown`` is the config value to name in the
    error, e.g. T5's whole feed_forward_proj)."""
    if not isinstance(act, str) or act not in table:
        raise UserError(f"activation {shown!r} has no t5lite equivalent; supported: "
                        f"{', '.join(sorted(table))}.")
    return table[act]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One t5lite leaf <-> one HF tensor (or one third of GPT-2's fused c_attn)."""

    path: tuple  # t5lite path; a "layers" element is the layer stack
    hf: str  # HF tensor name
    hf_shape: tuple  # shape of the HF tensor (of its piece, when split)
    transpose: bool = False  # HF stores it [out, in] (torch Linear) or [buckets, heads]
    layer: Optional[int] = None  # index into the layer stack
    split: Optional[tuple] = None  # (piece, pieces) along the HF tensor's last axis


def linear_rules(path, hf, n_in, n_out, layer=None, bias=False) -> list:
    """torch Linear [out, in] (+ bias [out]) <-> t5lite DenseGeneral kernel (+ bias)."""
    rules = [Rule(path + ("kernel",), hf + ".weight", (n_out, n_in), True, layer)]
    if bias:
        rules.append(Rule(path + ("bias",), hf + ".bias", (n_out,), False, layer))
    return rules


def conv1d_rules(path, hf, n_in, n_out, layer, split=None) -> list:
    """GPT-2 Conv1D: weight already [in, out]."""
    return [Rule(path + ("kernel",), hf + ".weight", (n_in, n_out), False, layer, split),
            Rule(path + ("bias",), hf + ".bias", (n_out,), False, layer, split)]


def norm_rules(path, hf, d, layer=None, bias=True) -> list:
    rules = [Rule(path + ("scale",), hf + ".weight", (d,), False, layer)]
    if bias:
        rules.append(Rule(path + ("bias",), hf + ".bias", (d,), False, layer))
    return rules


def narrow_embedding_problems(m) -> list:
    """Only ELECTRA maps an embedding narrower than d_model (its embeddings_project)."""
    if m.embed_dim:
        return [f"embed_dim={m.embed_dim} (only ELECTRA exports a narrower embedding)"]
    return []


def head_split_problems(m) -> list:
    """HF BERT / GPT-2 derive the head size as hidden_size / heads."""
    if m.d_model != m.num_heads * m.head_dim:
        return [f"d_model={m.d_model} != num_heads*head_dim={m.num_heads * m.head_dim}"]
    return []


def _unchanged_names(hf_cfg: dict, tensors: dict) -> dict:
    return tensors


def _no_problems(m) -> list:
    return []


def _unchanged_tensors(m, hf_cfg: dict, tensors: dict) -> dict:
    return tensors


def _whole_model(m, params: dict) -> tuple:
    return m, params


@dataclasses.dataclass(frozen=True)
class Family:
    """One HF family's mapping, as the import / export drivers use it."""

    name: str  # "t5", "bert", "roberta", "electra", "gpt2"
    fill_config: Callable  # (cfg, hf_cfg, tensors or None): sets cfg.model.* and feature_lengths
    config_to_hf: Callable  # (ModelConfig) -> the HF config.json dict
    rules: Callable  # (ModelConfig) -> ([Rule], names of HF tensors import may ignore)
    export_needs: dict  # ModelConfig field -> the value export requires
    ffn_out: dict  # t5lite ffn -> the HF activation name export writes
    # (head, embedding) tensor names: a tied head stored in the file must equal the embedding
    tied_head: Optional[tuple] = None
    # (hf_cfg, tensors) -> tensors under the names its rules use (before the config is mapped)
    names_from_hf: Callable = _unchanged_names
    # (ModelConfig) -> export problems specific to this family, as "field=value (why)"
    export_problems: Callable = _no_problems
    # (ModelConfig, hf_cfg, tensors) -> tensors: head fix-ups after the config is mapped
    fix_imported: Callable = _unchanged_tensors
    # (ModelConfig, hf_cfg, tensors) -> tensors: the copies / names the HF file holds on export
    fix_exported: Callable = _unchanged_tensors
    # (ModelConfig, params) -> the (ModelConfig, params) of the part that export writes
    exported_model: Callable = _whole_model
