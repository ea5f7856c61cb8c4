"""t5lite params <-> HF tensors through one family's Rules: ``hf_to_t5lite`` and
``t5lite_to_hf``. Reshapes are row-major on both sides (HF splits heads as [H * K] = H-major),
so export is the exact inverse of import. Every t5lite leaf must be produced and every HF
tensor consumed (or be a known tied copy), so an unsupported variant fails loudly, never
silently."""

from __future__ import annotations

from typing import Optional

import numpy as np
from flax import traverse_util

from t5lite.convert import t5lite_setup, tokenizer_files
from t5lite.convert.common import Rule
from t5lite.convert.families import (FAMILIES, SUPPORTED, config_from_hf, family_of,
                                     hf_architecture)
from t5lite.convert.hf_files import read_hf_dir, write_hf_dir
from t5lite.errors import UserError


def hf_to_t5lite(hf_dir: str, scan_layers: bool = True):
    """-> (Config, params): params is the unboxed float32 numpy pytree that
    ``build_model(cfg.model).init`` would produce, with the HF weights."""
    cfg, params, _ = import_hf(hf_dir, scan_layers)
    return cfg, params


def import_hf(hf_dir: str, scan_layers: bool = True):
    """-> (Config, params, note): hf_to_t5lite's, and one line on where the Config's
    training setup comes from (the t5lite_config.json an export wrote, or t5lite's defaults:
    t5lite_setup)."""
    hf_cfg, tensors = read_hf_dir(hf_dir)
    arch = hf_architecture(hf_cfg)
    family = FAMILIES[SUPPORTED[arch]]
    tensors = family.names_from_hf(hf_cfg, _layer_norm_names(tensors))
    try:
        cfg = config_from_hf(hf_cfg, tensors, scan_layers)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{hf_dir}/config.json is malformed for {family.name} "
                        f"({type(e).__name__}: {e}); it must be the config.json save_pretrained "
                        "wrote with these weights") from None
    m = cfg.model
    tensors = family.fix_imported(m, hf_cfg, tensors)
    rules, ignorable = family.rules(m)
    want = _abstract_leaves(m)
    flat = _params_from_rules(rules, tensors, want, m.scan_layers, hf_dir, arch)
    _check_tied(family.tied_head, m, tensors, hf_dir)
    unused = sorted(set(tensors) - {r.hf for r in rules} - ignorable)
    if unused:
        raise UserError(f"{hf_dir}: {len(unused)} tensors have no t5lite counterpart (a different "
                        f"head or variant?): {', '.join(unused[:6])}. Supported: "
                        f"{', '.join(SUPPORTED)} as saved by transformers.")
    _check_complete(flat, want)

    def same_model(saved) -> bool:
        try:
            same_hf = family.config_to_hf(saved) == family.config_to_hf(m)
        except UserError:  # the saved model is not exportable: not what was exported
            return False
        return same_hf and _abstract_leaves(saved) == want

    cfg, note = t5lite_setup.restore(hf_dir, cfg, same_model)
    return cfg, traverse_util.unflatten_dict(flat), note


def t5lite_to_hf(cfg, params, out_dir: str, tokenizer: Optional[bool] = None) -> str:
    """Write ``out_dir/config.json`` + ``model.safetensors`` loadable by transformers'
    from_pretrained, the tokenizer files of the task's vocabulary (tokenizer_files) and, for
    a full Config, the t5lite setup (t5lite_setup); returns out_dir. ``params``: the unboxed
    tree for ``cfg`` (Config or ModelConfig).
    ``tokenizer``: None writes it when ``cfg`` names a task whose vocabulary fits the model
    (``tokenizer_files.find`` says why not), True requires it, False writes weights only."""
    m = getattr(cfg, "model", cfg)
    family = FAMILIES[family_of(m)]
    hf_cfg = family.config_to_hf(m)
    vocab, why = tokenizer_files.find(cfg) if tokenizer is not False else (None, "")
    if tokenizer and vocab is None:
        raise UserError(f"no tokenizer can be exported: {why}.")
    m, params = family.exported_model(m, params)
    rules, _ = family.rules(m)
    flat = {p: np.asarray(v, np.float32)
            for p, v in traverse_util.flatten_dict(params).items()}
    _check_params(flat, _abstract_leaves(m))
    tensors = family.fix_exported(m, hf_cfg, _tensors_from_rules(rules, flat, m.scan_layers))
    if vocab is not None:
        hf_cfg.update(tokenizer_files.special_ids(vocab))
    write_hf_dir(hf_cfg, tensors, out_dir)
    t5lite_setup.write(cfg, m, out_dir)
    if vocab is not None:
        tokenizer_files.write(vocab, out_dir, _max_length(cfg, m))
    return out_dir


def _max_length(cfg, m) -> int:
    """What the tokenizer may hand the model: the learned positions, or (T5) the task's."""
    if m.position == "learned":
        return m.max_length
    return int(dict(cfg.data.feature_lengths).get("inputs", 512))


def _layer_norm_names(tensors: dict) -> dict:
    """Older checkpoints name LayerNorm's weight / bias gamma / beta."""
    return {k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                     "LayerNorm.bias"): v
            for k, v in tensors.items()}


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


def _params_from_rules(rules: list, tensors: dict, want: dict, scan: bool, hf_dir: str,
                       arch: str) -> dict:
    """{t5lite path: array} for every rule, layers stacked when ``scan``."""
    layers: dict = {}
    flat: dict = {}
    for r in rules:
        if r.hf not in tensors:
            raise UserError(f"{hf_dir}: tensor {r.hf} is missing; the weights do not match "
                            f"config.json ({arch}). Re-save the model with transformers' "
                            "save_pretrained.")
        x = tensors[r.hf]
        if r.split is not None:
            if x.shape[-1] % r.split[1]:
                raise UserError(f"{r.hf} has shape {x.shape}; its last axis must split in "
                                f"{r.split[1]}")
            x = np.split(x, r.split[1], axis=-1)[r.split[0]]
        if tuple(x.shape) != tuple(r.hf_shape):
            raise UserError(f"{hf_dir}: {r.hf} has shape {tuple(x.shape)} but config.json implies "
                            f"{tuple(r.hf_shape)} (vocab_size / hidden sizes / layer counts); "
                            "fix config.json to match the weights.")
        path = _leaf_path(r, scan)
        if path not in want:
            raise RuntimeError(f"convert rule for {path}: not a parameter of this model")
        stacked = scan and r.layer is not None
        x = np.ascontiguousarray(x.T if r.transpose else x, np.float32).reshape(
            want[path][1:] if stacked else want[path])
        if stacked:
            layers.setdefault(path, {})[r.layer] = x
        else:
            flat[path] = x
    for path, per_layer in layers.items():
        flat[path] = np.stack([per_layer[i] for i in range(len(per_layer))])
    return flat


def _check_tied(tied_head, m, tensors: dict, hf_dir: str):
    """A 'tied' head stored in the file must equal the embedding, else we would drop it."""
    if tied_head is None:  # no output layer
        return
    name, emb = tied_head
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


def _check_params(flat: dict, want: dict):
    """Export: ``params`` hold exactly the leaves, with the shapes, the config defines."""
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


def _tensors_from_rules(rules: list, flat: dict, scan: bool) -> dict:
    """{HF name: array}; GPT-2's fused c_attn joined from its thirds."""
    pieces: dict = {}
    for r in rules:
        x = flat[_leaf_path(r, scan)]
        if scan and r.layer is not None:
            x = x[r.layer]
        x = x.reshape(r.hf_shape[::-1] if r.transpose else r.hf_shape)
        x = x.T if r.transpose else x
        pieces.setdefault(r.hf, {})[r.split[0] if r.split else 0] = x
    return {name: np.ascontiguousarray(
        np.concatenate([p[i] for i in range(len(p))], axis=-1) if len(p) > 1 else p[0])
        for name, p in pieces.items()}
