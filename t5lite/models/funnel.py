"""Funnel Transformer encoder (Dai et al. 2020) as the paper codebase configured it for an
encoder-decoder (Mesh TensorFlow funnel_transformer.py): the encoder's layers form blocks
(model.funnel_blocks, e.g. (4, 4, 4)); the first layer of every block after the first
mean-pools the sequence by 2 after its self-attention (the attention itself runs at the
incoming length), so the encoder output is 2^(blocks-1) times shorter. The decoder is
unchanged and cross-attends to the pooled sequence; its key mask takes every
2^(blocks-1)-th encoder id, the pooled positions are the first ones (relative position
biases are sliced, not recomputed), as in the reference.
"""

from __future__ import annotations

import jax.numpy as jnp

from t5lite.errors import UserError

POOL_SIZE = 2


def length_factor(cfg) -> int:
    """How many times shorter the encoder output is than its input."""
    return POOL_SIZE ** max(len(cfg.funnel_blocks) - 1, 0)


def pool_at(cfg, kind: str, index: int) -> int:
    """The pooling size after layer ``index``'s self-attention in a ``kind`` stack (1 = none)."""
    if kind != "encoder" or not cfg.funnel_blocks:
        return 1
    starts = [sum(cfg.funnel_blocks[:b]) for b in range(1, len(cfg.funnel_blocks))]
    return POOL_SIZE if index in starts else 1


def mean_pool(x_BLD, size: int):
    """[B, L, D] -> [B, L / size, D], the mean of each window of ``size`` positions."""
    b, length, d = x_BLD.shape
    if length % size:
        raise UserError(f"model.funnel_blocks pools the encoder sequence by {size} per block: "
                        f"its length {length} must divide by it; make data.feature_lengths "
                        f"inputs a multiple of the funnel's total factor.")
    pooled = jnp.mean(x_BLD.reshape(b, length // size, size, d).astype(jnp.float32), axis=2)
    return pooled.astype(x_BLD.dtype)


def pool_context(ctx, size: int):
    """The LayerContext of the pooled sequence: every ``size``-th query / key of the mask (the
    mask of every size-th id), the first positions' position bias and RoPE positions."""
    n = ctx.bias.shape[-1] // size
    pos_bias = None if ctx.pos_bias is None else ctx.pos_bias[:, :, :n, :n]
    rope_pos = None if ctx.rope_pos is None else ctx.rope_pos[:, :n]
    valid = None if ctx.valid is None else ctx.valid[:, ::size]
    return ctx.replace(bias=ctx.bias[:, :, ::size, ::size], pos_bias=pos_bias, rope_pos=rope_pos,
                       valid=valid)


def pool_ids(cfg, tokens_BS, segments_BS=None):
    """The encoder ids the decoder's cross-attention mask reads, at the pooled length."""
    f = length_factor(cfg)
    if f == 1:
        return tokens_BS, segments_BS
    return tokens_BS[:, ::f], None if segments_BS is None else segments_BS[:, ::f]
