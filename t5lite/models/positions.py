"""Position schemes: sinusoidal encodings, rotary embeddings (RoPE), ALiBi biases and T5's
bucketed relative position bias.

Shapes: B batch, L / Q query length, S key length, H heads, K head dim.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np


def sinusoidal(positions_BL, d: int, max_wavelength: float = 10000.0):
    """Fixed [sin | cos] position encodings (Vaswani et al.), shape [B, L, d]."""
    half = d // 2
    inv_freq = max_wavelength ** (-np.arange(half, dtype=np.float32) / max(half - 1, 1))
    angle = positions_BL[..., None].astype(jnp.float32) * inv_freq
    return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


def apply_rope(x_BLHK, positions_BL, max_wavelength: float = 10000.0):
    """Rotary embedding (rotate-half form) over the full head dim."""
    k = x_BLHK.shape[-1]
    inv_freq = max_wavelength ** (-np.arange(0, k, 2, dtype=np.float32) / k)
    angle = positions_BL[..., None].astype(jnp.float32) * inv_freq  # [B, L, K/2]
    sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]
    x1, x2 = jnp.split(x_BLHK.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BLHK.dtype)


def alibi_bias(q_pos_BQ, k_pos_BS, num_heads: int):
    """ALiBi: -slope_h * |q - k|, geometric slopes (Press et al.); shape [B, H, Q, S]."""
    def slopes(n):
        start = 2 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    power_of_two = 2 ** math.floor(math.log2(num_heads))
    slopes_H = (slopes(power_of_two)
                + slopes(2 * power_of_two)[0::2][:num_heads - power_of_two])
    dist = jnp.abs(q_pos_BQ[:, :, None] - k_pos_BS[:, None, :]).astype(jnp.float32)
    return -jnp.asarray(slopes_H, jnp.float32)[None, :, None, None] * dist[:, None]


class RelativePositionBias(nn.Module):
    """T5 bucketed relative position bias, one scalar per (bucket, head), shared by all layers."""

    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool

    def bucket(self, rel, bidirectional=None):  # rel = key_pos - query_pos
        n = self.num_buckets
        ret = 0
        if self.bidirectional if bidirectional is None else bidirectional:
            n //= 2
            ret = (rel > 0).astype(jnp.int32) * n
            rel = jnp.abs(rel)
        else:
            rel = jnp.maximum(-rel, 0)
        max_exact = n // 2
        is_small = rel < max_exact
        large = max_exact + (
            jnp.log(rel.astype(jnp.float32) / max_exact + np.finfo(np.float32).eps)
            / math.log(self.max_distance / max_exact) * (n - max_exact)).astype(jnp.int32)
        large = jnp.minimum(large, n - 1)
        return ret + jnp.where(is_small, rel, large)

    @nn.compact
    def __call__(self, q_pos_BQ, k_pos_BS, bidirectional=None):
        """``bidirectional`` overrides the attribute (a shared encoder-decoder's encoder reads
        its decoder's table with bidirectional buckets). Without positions: the [H, N] table
        itself (the flash attention kernel makes the bias from it)."""
        table_HN = self.param("rel_embedding", nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
            ("heads", "relpos_buckets")), (self.num_heads, self.num_buckets), jnp.float32)
        if q_pos_BQ is None:
            return table_HN
        buckets_BQS = self.bucket(k_pos_BS[:, None, :] - q_pos_BQ[:, :, None], bidirectional)
        return jnp.transpose(table_HN[:, buckets_BQS], (1, 0, 2, 3))  # [B, H, Q, S]
