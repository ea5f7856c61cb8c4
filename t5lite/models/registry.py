"""The kinds of registry entry a model variant declares beside its own code (models/plan.py lists
them and resolves a config's choices into a StackPlan once).

Each entry is a frozen dataclass: hashable, so a plan holding entries can be a Flax module
field and pass through nn.scan / nn.remat. Adding a variant: its module file defines its entry
(one of these kinds, named by the config value that picks it), and plan.py's registry of that
kind lists it (one line).

Shapes: B batch, T query length, S key length, H heads, K head dim, D embed.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional


@dataclasses.dataclass(frozen=True)
class AttentionBackend:
    """How a dot-product attention layer attends (``model.attention_kernel``).

    ``attend(module, q_BTHK, k_BSHK, v_BSHK, bias, deterministic) -> out_BTHK`` runs inside the
    attention module's compact call (its submodules, e.g. dropout, are the module's).
    ``context``: None when the Stack builds the [B, 1, T, S] mask bias and position biases as
    arrays (XLA); else ``context(stack, q_valid_BL, segments_BL, rope_BL, encoded_BSD,
    encoder_tokens_BS, encoder_segments_BS, deterministic) -> LayerContext`` (with ``backend``
    this entry) whose ``bias`` / ``cross_bias`` are what ``attend`` reads. A backend with a
    context runs outside decoding and prompt tuning only: there the Stack uses the arrays
    backend (StackPlan.backend_for). ``choose``: an entry that stands for another, picked
    when a Stack is traced, ``choose(stack_cfg, deterministic) -> AttentionBackend`` ("auto":
    gpu_attention.resolve); such an entry never attends itself (``attend`` None).
    """

    name: str
    attend: Optional[Callable]
    context: Optional[Callable] = None
    choose: Optional[Callable] = None


def kernel_attend(module, q_BTHK, k_BSHK, v_BSHK, bias, deterministic):
    """The attend step of a backend whose bias objects run their kernel themselves
    (``bias.attend(q, k, v)``: flash_attention.KernelBias and the like)."""
    return bias.attend(q_BTHK, k_BSHK, v_BSHK)


@dataclasses.dataclass(frozen=True)
class TokenMixer:
    """The self-attention sub-layer's module (``model.attention_type``): ``build(attention_cls,
    causal, backend) -> class`` called as cls(cfg, name=...)(x, x, bias, rope_pos,
    deterministic, decode, cache_index); ``attention_cls`` is the Stack's dot-product attention
    class (PEFT's when it adapts it), ``causal`` whether the stack is a decoder, ``backend``
    the AttentionBackend of this call; ``names``: the config values that pick it."""

    names: tuple
    build: Callable


@dataclasses.dataclass(frozen=True)
class FFNLayer:
    """A Block's FFN sub-layer (``model.ffn_layer``): ``module`` (None = the Stack's dense MLP
    class), called as module(cfg, name="mlp")(x, deterministic); ``routed``: it also takes
    ``valid_BL`` (the real tokens) and ``decoder`` (a mixture of experts)."""

    name: str
    module: Optional[type] = None
    routed: bool = False


@dataclasses.dataclass(frozen=True)
class BlockType:
    """A Stack's layer module (``model.block_type``): ``module`` is built and called like
    transformer.Block (fields plan, layer, scanned; call (x, ctx, deterministic, decode))."""

    name: str
    module: type


@dataclasses.dataclass(frozen=True)
class OutputLayer:
    """A decoder's vocabulary projection: ``logits(stack, x_BLD) -> [B, L, V]`` (the Stack's
    embedder / logits_dense), and whether the Stack owns a ``logits_dense`` layer."""

    name: str
    logits: Callable
    owns_dense: bool = False
