"""Gradual unfreezing (T5 paper Sec. 3.5.1): which layer group each param belongs to and how
many groups train at a step, and the optax wrapper that opens them (``gradual_unfreeze``: the
open set is computed inside the jitted update, so the step never recompiles)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5lite.peft.masks import leaves_with_paths, path_str
from t5lite.peft.methods import PROMPT_NAME

# params that open with the bottom layer (besides an input-only token embedding)
BOTTOM_NAMES = ("position_embedder", "token_type_embedder", "embed_norm", "relpos_bias",
                PROMPT_NAME)


def _embedding_is_output_layer(mcfg) -> bool:
    """The token embedding doubles as the output layer (tied LM head of T5 v1.0 / GPT)."""
    return mcfg.tie_embeddings and mcfg.architecture != "encoder_only"


def unfreeze_groups(mcfg, params):
    """Pytree like params of int arrays broadcastable to each leaf: the unfreezing group, i.e.
    the step (in units of ``unfreeze_every``) from which a parameter trains. As in the T5 paper
    (Sec. 3.5.1, after Howard and Ruder 2018): group 0 is the top layer of every stack with
    everything above it (final norms, heads, the output layer); layer i of a stack of n layers
    is group n-1-i, so encoder and decoder open in parallel from the top; the input embeddings
    (and soft prompt, relative-position bias) open with the bottom layer, so that the last
    episode trains the entire network, except a token embedding tied to the output layer, which
    trains throughout ("since the parameters of our input embedding matrix and output
    classification matrix are shared, we update them throughout fine-tuning")."""
    depth = {"encoder": mcfg.num_encoder_layers, "decoder": mcfg.num_decoder_layers}
    bottom = total_layers(mcfg) - 1
    leaves, treedef = leaves_with_paths(params)
    out = []
    for path, leaf in leaves:
        parts = path_str(path).split("/")
        group = np.array(0)
        if parts[0] in depth and len(parts) > 1 and parts[1] == "layers":
            n = leaf.shape[0]
            group = (n - 1 - np.arange(n)).reshape((n,) + (1,) * (len(leaf.shape) - 1))
        elif parts[0] in depth and len(parts) > 1 and parts[1].startswith("layers_"):
            group = np.array(depth[parts[0]] - 1 - int(parts[1][len("layers_"):]))
        elif any(p in BOTTOM_NAMES for p in parts) or (
                "token_embedder" in parts and not _embedding_is_output_layer(mcfg)):
            group = np.array(bottom)
        out.append(group)
    return jax.tree_util.tree_unflatten(treedef, out)


def total_layers(mcfg) -> int:
    """Layer groups opened one by one: the deepest stack (encoder and decoder go in parallel)."""
    if mcfg.architecture == "encoder_only":
        return mcfg.num_encoder_layers
    if mcfg.architecture == "encoder_decoder" and not mcfg.shared_encoder_decoder:
        return max(mcfg.num_encoder_layers, mcfg.num_decoder_layers)
    return mcfg.num_decoder_layers


def opened_groups(mcfg, step):
    """Groups < this train at optimizer step ``step`` (0-based) under gradual unfreezing
    (traceable)."""
    return _opened(mcfg.peft.unfreeze_every, mcfg.peft.unfreeze_layers, step)


def _opened(every: int, layers: int, step):
    return layers * (step // every + 1)


class Unfreeze(NamedTuple):
    """Gradual unfreezing as data: ``groups`` (pytree like params of int arrays broadcastable
    to each leaf: the episode from which it trains), ``every`` (steps per episode), ``layers``
    (groups opened per episode)."""

    groups: Any
    every: int
    layers: int = 1


class UnfreezeState(NamedTuple):
    count: jax.Array
    inner: Any


def gradual_unfreeze(unfreeze: Unfreeze, inner: optax.GradientTransformation):
    """Wrap ``inner`` so that only groups < opened_groups(mcfg, step) get gradients and updates
    (exact zeros elsewhere: those params stay bit-identical). The step lives in the optimizer
    state and the mask is computed inside the jitted update: no recompiles."""
    groups = unfreeze.groups

    def masked(tree, opened):
        return jax.tree.map(lambda x, g: jnp.where(jnp.asarray(g) < opened, x,
                                                   jnp.zeros_like(x)), tree, groups)

    def init(params):
        return UnfreezeState(count=jnp.zeros((), jnp.int32), inner=inner.init(params))

    def update(grads, state, params=None):
        opened = _opened(unfreeze.every, unfreeze.layers, state.count)
        updates, inner_state = inner.update(masked(grads, opened), state.inner, params)
        return masked(updates, opened), UnfreezeState(count=state.count + 1, inner=inner_state)

    return optax.GradientTransformation(init, update)
