"""Which params train: the trainable mask (PEFT params, ``train_also`` heads, ``freeze``
globs), its counts and log line, and the optimizer built from it.

Pure functions of a ModelConfig and a params tree; the masks are data for
``optim.make_optimizer`` (peft/optimizer.py is the glue) and for the trainer's
trainable-subset gradients (``grad_mask``).
"""

from __future__ import annotations

import fnmatch
import math

import flax.linen as nn
import jax

from t5lite.errors import UserError
from t5lite.peft.methods import (
    ADAPTER_SUFFIX, IA3_NAMES, LORA_NAMES, PREFIX_NAMES, PROMPT_NAME, enabled)


def path_str(path) -> str:
    """A jax key path -> "encoder/layers/attention/query/kernel"."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def is_peft_param(path: str) -> bool:
    parts = path.split("/")
    return (parts[-1] in LORA_NAMES + IA3_NAMES + PREFIX_NAMES or parts[-1] == PROMPT_NAME
            or any(p.endswith(ADAPTER_SUFFIX) for p in parts))


def leaves_with_paths(params):
    """(leaves with their key paths, treedef) of the unboxed ``params``."""
    return jax.tree_util.tree_flatten_with_path(nn.meta.unbox(params))


def trainable_mask(mcfg, params):
    """Pytree of bools like ``params``: True = trained.

    Order of rules: with PEFT on and ``train_only_peft``, only PEFT params and ``train_also``
    train; then ``freeze`` globs freeze whatever they match. Freezing alone (no PEFT) trains
    everything that no ``freeze`` glob matches.
    """
    p = mcfg.peft
    leaves, treedef = leaves_with_paths(params)
    only_peft = enabled(mcfg) and p.train_only_peft
    mask = []
    for path, _ in leaves:
        name = path_str(path)
        train = not only_peft or is_peft_param(name) or any(
            fnmatch.fnmatchcase(name, g) for g in p.train_also)
        if any(fnmatch.fnmatchcase(name, g) for g in p.freeze):
            train = False
        mask.append(train)
    if leaves and not any(mask):
        raise UserError("model.peft leaves no parameter trainable (freeze patterns match "
                        "everything?); loosen model.peft.freeze")
    return jax.tree_util.tree_unflatten(treedef, mask)


def needs_mask(mcfg) -> bool:
    return enabled(mcfg) or bool(mcfg.peft.freeze)


def grad_mask(mcfg, params):
    """The params that need gradients, or None (all): the static trainable mask. Gradual
    unfreezing opens a growing subset of it inside one compiled step, so it keeps the whole
    mask's gradients and zeroes the closed layers in the optimizer."""
    return trainable_mask(mcfg, params) if needs_mask(mcfg) else None


def count_trainable(params, mask=None) -> tuple[int, int]:
    """(trainable, total) number of parameters (``mask`` None = everything trains)."""
    leaves = [x for _, x in leaves_with_paths(params)[0]]
    flags = [True] * len(leaves) if mask is None else jax.tree.leaves(mask)
    total = sum(math.prod(x.shape) for x in leaves)
    train = sum(math.prod(x.shape) for x, t in zip(leaves, flags) if t)
    return train, total


def describe(mcfg, params) -> str:
    """The log line: trainable params and which PEFT methods are on."""
    train, total = count_trainable(params, grad_mask(mcfg, params))
    p = mcfg.peft
    methods = [m for m, on in (("lora", p.lora_rank), ("prompt", p.prompt_tokens),
                               ("prefix", p.prefix_tokens), ("adapters", p.adapter_dim),
                               ("ia3", p.ia3), ("freeze", p.freeze),
                               ("gradual_unfreeze", p.unfreeze_every)) if on]
    return (f"trainable params: {train:,} of {total:,} ({100.0 * train / max(total, 1):.3f}%)"
            + (f" [{', '.join(methods)}]" if methods else ""))

