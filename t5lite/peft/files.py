"""PEFT param files and LoRA merging: a PEFT-only params dir holds the trained subset (a few
KB to MB instead of the whole model) and goes on top of a base checkpoint; ``merge_lora``
folds LoRA into the base kernels. (t5lite.store.checkpointing, which brings orbax, is imported
where a file is read or written.)"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import traverse_util

from t5lite.errors import UserError
from t5lite.peft.masks import count_trainable, leaves_with_paths, path_str, trainable_mask
from t5lite.peft.methods import LORA_NAMES, PEFT_MARKER, enabled


def peft_subset(mcfg, params) -> dict:
    """The trained params only (PEFT params and train_also heads) as a nested dict."""
    mask = trainable_mask(mcfg, params)
    flat = {}
    for (path, leaf), t in zip(leaves_with_paths(params)[0], jax.tree.leaves(mask)):
        if t:
            flat[path_str(path)] = leaf
    return traverse_util.unflatten_dict(flat, sep="/")


def save_peft(path: str, cfg, params) -> None:
    """Write a params-only checkpoint (CONTRACTS.md: config.json + params/) holding only the
    trained params, marked by a ``peft_only.json`` (their paths and counts). A few KB to MB
    instead of the whole model; ``load_peft`` puts it on top of a base checkpoint.
    ``cfg``: the full Config (saved as config.json)."""
    subset = peft_subset(cfg.model, params)
    train, total = count_trainable(params, trainable_mask(cfg.model, params))
    from t5lite.store import checkpointing
    checkpointing.save_params_dir(path, cfg, subset, {PEFT_MARKER: {
        "trainable_params": train, "model_params": total,
        "paths": sorted(path_str(p) for p, _ in leaves_with_paths(subset)[0])}}, overwrite=True)


def save_with_checkpoint(cfg, workdir: str, step: int, params) -> None:
    """Trainer hook: with PEFT on (and model.peft.save_peft_params), write workdir/peft/<step>/
    beside checkpoints/<step>/ and keep the newest checkpoint.keep of them."""
    from t5lite.store import checkpointing
    if not (enabled(cfg.model) and cfg.model.peft.save_peft_params):
        return
    root = epath.Path(checkpointing.abspath(workdir)) / "peft"
    save_peft(str(root / str(step)), cfg, params)
    keep = cfg.checkpoint.keep
    if jax.process_index() == 0 and keep > 0:
        steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
        for old in steps[:-keep]:
            (root / str(old)).rmtree()


def load_peft(path: str, base_params):
    """-> (Config, params): ``base_params`` (e.g. from checkpointing.load_params of the base
    model, or a fresh init) with the saved PEFT params of ``path`` put on top."""
    from t5lite.store import checkpointing
    path = checkpointing.abspath(path)
    cfg_file = epath.Path(path) / "config.json"
    if not (epath.Path(path) / PEFT_MARKER).exists() or not cfg_file.exists():
        raise UserError(f"{path} is not a PEFT params dir (config.json + {PEFT_MARKER} + "
                        "params/), as written by peft.save_peft / training with "
                        "model.peft.save_peft_params (workdir/peft/<step>)")
    cfg, saved = checkpointing.load_params(path)
    flat_saved = {path_str(p): v for p, v in jax.tree_util.tree_leaves_with_path(saved)}
    leaves, treedef = leaves_with_paths(base_params)
    base_keys = {path_str(p) for p, _ in leaves}
    missing = sorted(set(flat_saved) - base_keys)
    if missing:
        raise UserError(f"the base params lack {len(missing)} PEFT params of {path} (e.g. "
                        f"{missing[0]}); build the base model with the PEFT config saved in "
                        f"{cfg_file} (model.peft)")
    out = []
    for p, leaf in leaves:
        v = flat_saved.get(path_str(p))
        if v is None:
            out.append(leaf)
            continue
        if tuple(v.shape) != tuple(leaf.shape):
            raise UserError(f"{path_str(p)}: saved shape {tuple(v.shape)} != base shape "
                            f"{tuple(leaf.shape)}; the base model config differs from the one "
                            "the PEFT params were trained with")
        sharding = getattr(leaf, "sharding", None)
        v = jnp.asarray(v, leaf.dtype)
        out.append(jax.device_put(v, sharding) if sharding is not None else v)
    return cfg, jax.tree_util.tree_unflatten(treedef, out)


def merge_lora(mcfg, params):
    """Fold LoRA into the base kernels: W' = W + (alpha / r) A B. -> (mcfg without LoRA,
    params without lora_a / lora_b); works for scanned ([layers, ...]) and unrolled params."""
    rank, scale = mcfg.peft.lora_rank, mcfg.peft.lora_alpha / max(mcfg.peft.lora_rank, 1)
    if not rank:
        raise UserError("merge_lora: model.peft.lora_rank is 0, there is no LoRA to merge")

    def merge(tree):
        if not isinstance(tree, dict):
            return tree
        if "lora_a" in tree and "lora_b" in tree:
            a, b, w = tree["lora_a"], tree["lora_b"], tree["kernel"]
            lead_in = a.shape[:-1]
            feat = w.shape[len(lead_in):]
            lead = b.shape[:b.ndim - 1 - len(feat)]
            n_in = int(np.prod(lead_in[len(lead):]))
            a2 = a.reshape(lead + (n_in, rank)).astype(jnp.float32)
            b2 = b.reshape(lead + (rank, int(np.prod(feat)))).astype(jnp.float32)
            delta = (a2 @ b2).reshape(w.shape) * scale
            rest = {k: v for k, v in tree.items() if k not in LORA_NAMES}
            return {**rest, "kernel": (w.astype(jnp.float32) + delta).astype(w.dtype)}
        return {k: merge(v) for k, v in tree.items()}

    merged = merge(jax.tree.map(lambda x: x, nn.meta.unbox(params)))
    return dataclasses.replace(mcfg, peft=dataclasses.replace(mcfg.peft, lora_rank=0)), merged
