"""SpanBERT's Span Boundary Objective head (Joshi et al. 2020, Section 3.2).

Each masked token x_i of a span (s, e) is predicted from the encoder outputs at the span's
boundary tokens x_{s-1}, x_{e+1} and a relative position embedding p_{i-s+1}:

    h_i = LayerNorm(GeLU(W2 LayerNorm(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s+1}]))))

EncoderOnly then projects h_i with the MLM output layer (tied embeddings and mlm_bias), so the
SBO shares the vocabulary projection with the MLM, as in the paper. Params::

    sbo/position_embedder/embedding   [sbo_max_span_length + 1, D] (row 0: unmasked tokens)
    sbo/dense_0/{kernel [3D, D], bias}, sbo/norm_0/{scale, bias}
    sbo/dense_1/{kernel [D, D], bias},  sbo/norm_1/{scale, bias}
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from t5lite.models import layers as L


class SpanBoundaryHead(nn.Module):
    """[B, L, D] encoder outputs + per-prediction boundary positions / offsets [B, N] ->
    hidden states [B, N, D] for the vocabulary projection."""

    cfg: object

    @nn.compact
    def __call__(self, x_BLD, left_BN, right_BN, offset_BN):
        cfg = self.cfg
        dtype = L.compute_dtype(cfg)

        def at(pos_BN):
            return jnp.take_along_axis(x_BLD, pos_BN[..., None], axis=1)

        # offsets past the table share its last row (spans are <= 10 words, not tokens)
        offset_BN = jnp.clip(offset_BN, 0, cfg.sbo_max_span_length)
        p_BND = L.Embed(cfg.sbo_max_span_length + 1, cfg.d_model, ("abspos", "embed"), dtype,
                        L.embed_init(cfg), cfg.gradient_rules,
                        name="position_embedder")(offset_BN)
        h = jnp.concatenate([at(left_BN).astype(dtype), at(right_BN).astype(dtype), p_BND], -1)
        for i, axes in enumerate((("mlp", "embed"), ("embed", "mlp"))):
            h = L.make_dense(cfg, cfg.d_model, axes, use_bias=True, name=f"dense_{i}")(h)
            h = L.Norm("layernorm", cfg.norm_eps, dtype, cfg.gradient_rules,
                       name=f"norm_{i}")(L.ACTIVATIONS["gelu"](h))
        return h
