"""The Evolved Transformer's blocks (So et al. 2019), as the Narang et al. 2021 reference
configured them (``model.block_type=evolved``; one evolved block stands for two vanilla
layers, so the paper's row halves the depth).

Encoder block, four residual sub-layers: GLU; a convolution branch (relu(D -> 4D) beside a
relu 3-tap convolution D -> D/2, summed, layer-normed, a 9-tap separable convolution
4D -> D/2 padded to D); self-attention; the MLP. Decoder block, five: a 2H-head
self-attention beside a cross-attention, summed; a branch of causal separable convolutions
(11 taps D -> 2D relu beside 7 taps D -> D/2, summed, layer-normed, 7 taps 2D -> D);
self-attention; cross-attention; a swish MLP. Convolutions read their taps through the
attention mask (models/local_conv.py): no leak across packed examples or from the future,
and decoding caches their inputs. The 2H-head branch sees the mask, not the H-head relative
position bias.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from t5lite.models import layers as L
from t5lite.models import residual
from t5lite.models.gradient_rules import add_position_bias
from t5lite.models.local_conv import LocalInputs, SeparableConv, shifted, tap_offsets
from t5lite.models.local_conv import visible_BTS as visible_from_bias
from t5lite.models.registry import BlockType


def pad_channels(x_BTF, width: int):
    """Zero channels appended up to ``width`` (the reference's branch sums)."""
    return jnp.pad(x_BTF, [(0, 0)] * (x_BTF.ndim - 1) + [(0, width - x_BTF.shape[-1])])


class Conv(nn.Module):
    """A full (not separable) convolution D -> ``features`` over ``offsets``, relu after."""

    cfg: object
    features: int
    offsets: tuple

    @nn.compact
    def __call__(self, x_BTD, visible_BTS, decode=False, cache_index=None):
        cfg = self.cfg
        src_BSD, slots_T = LocalInputs(name="inputs")(x_BTD, decode, cache_index)
        kernel_WDF = self.param("kernel", nn.with_logical_partitioning(
            nn.initializers.glorot_uniform(), (None, "embed", "mlp")),
            (len(self.offsets), x_BTD.shape[-1], self.features), jnp.float32)
        dtype = L.compute_dtype(cfg)
        out_BTF = 0.0
        for w, offset in enumerate(self.offsets):
            out_BTF = out_BTF + shifted(src_BSD, slots_T, visible_BTS, offset) @ kernel_WDF[
                w].astype(dtype)
        return nn.relu(out_BTF)


class EvolvedBlock(nn.Module):
    """One Evolved Transformer block, built and called like transformer.Block (same fields and
    call); its layers have no per-layer variants (``layer`` is the default LayerPlan)."""

    plan: object  # plan.StackPlan
    layer: object = None  # plan.LayerPlan
    scanned: bool = False

    @property
    def cfg(self):
        return self.plan.cfg

    @property
    def decoder(self) -> bool:
        return self.plan.decoder

    @property
    def modules(self):
        return self.plan.modules

    @nn.compact
    def __call__(self, x_BLD, ctx, deterministic=True, decode=False):
        cfg = self.cfg
        drop = lambda y: nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)  # noqa

        def sublayer(x, stem, fn):  # x + branch, pre- or post-norm, ReZero / Fixup scalars
            return residual.sublayer(self, cfg, x, stem, fn, deterministic, self.plan.residual)

        visible = visible_from_bias(ctx.bias)
        cross = self.plan.cross and ctx.encoded is not None
        conv = dict(decode=decode, cache_index=ctx.cache_index)
        if self.decoder:
            x_BLD = sublayer(x_BLD, "branched_attention", lambda y: self.branched_attention(
                y, ctx, cross, deterministic, decode))
            x_BLD = sublayer(x_BLD, "conv", lambda y: self.decoder_convs(y, visible, drop, conv))
        else:
            x_BLD = sublayer(x_BLD, "glu", lambda y: self.glu(y))
            x_BLD = sublayer(x_BLD, "conv", lambda y: self.encoder_convs(y, visible, drop, conv))
        stem = "self_attention" if self.decoder else "attention"
        bias = (ctx.bias if ctx.pos_bias is None
                else add_position_bias(ctx.bias, ctx.pos_bias, cfg.gradient_rules))
        attention = self.plan.mixer.build(self.modules.attention, self.decoder, ctx.backend)
        x_BLD = sublayer(x_BLD, stem, lambda y: attention(cfg, name=stem)(
            y, y, bias, ctx.rope_pos, deterministic, decode, ctx.cache_index))
        if cross:
            x_BLD = sublayer(x_BLD, "cross_attention", lambda y: self.modules.attention(
                cfg, cross=True, name="encoder_decoder_attention")(
                    y, ctx.encoded, ctx.cross_bias, deterministic=deterministic))
        mlp_cfg = dataclasses.replace(cfg, ffn="silu") if self.decoder else cfg
        x_BLD = sublayer(x_BLD, "mlp", lambda y: self.modules.mlp(mlp_cfg, name="mlp")(
            y, deterministic))
        x_BLD = L.constrain(x_BLD, ("batch", "length", "embed"))
        return (x_BLD, None) if self.scanned else x_BLD

    def glu(self, x_BLD):
        cfg = self.cfg
        dense = lambda n: L.make_dense(cfg, cfg.d_model, ("embed", "mlp"), False, name=n)  # noqa
        return dense("glu_linear")(x_BLD) * nn.sigmoid(dense("glu_gate")(x_BLD))

    def encoder_convs(self, x_BLD, visible, drop, conv):
        cfg = self.cfg
        d = cfg.d_model
        left = drop(nn.relu(L.make_dense(cfg, 4 * d, ("embed", "mlp"), False,
                                         name="conv1x1")(x_BLD)))
        right = drop(Conv(cfg, d // 2, tap_offsets(3, False), name="conv3x1")(
            x_BLD, visible, **conv))
        hidden = self.layer_norm("conv_layer_norm", left + pad_channels(right, 4 * d))
        out = SeparableConv(cfg, d // 2, tap_offsets(9, False), name="sep_conv9x1")(
            hidden, visible, **conv)
        return pad_channels(drop(out), d)

    def decoder_convs(self, x_BLD, visible, drop, conv):
        cfg = self.cfg
        d = cfg.d_model
        left = drop(SeparableConv(cfg, 2 * d, tap_offsets(11, True), "relu",
                                  name="sep_conv11x1")(x_BLD, visible, **conv))
        right = drop(SeparableConv(cfg, d // 2, tap_offsets(7, True), name="sep_conv7x1_1")(
            x_BLD, visible, **conv))
        hidden = self.layer_norm("conv_layer_norm", left + pad_channels(right, 2 * d))
        return SeparableConv(cfg, d, tap_offsets(7, True), name="sep_conv7x1_2")(
            hidden, visible, **conv)

    def layer_norm(self, name, x):
        cfg = self.cfg
        return L.Norm("layernorm", cfg.norm_eps, L.compute_dtype(cfg), cfg.gradient_rules,
                      name=name)(x)

    def branched_attention(self, y_BLD, ctx, cross, deterministic, decode):
        """2H-head self-attention + (H-head cross-attention) of the same input, summed."""
        cfg = self.cfg
        wide = dataclasses.replace(cfg, num_heads=2 * cfg.num_heads)
        out = self.modules.attention(wide, name="wide_self_attention")(
            y_BLD, y_BLD, ctx.bias, ctx.rope_pos, deterministic, decode, ctx.cache_index)
        if cross:
            out = out + self.modules.attention(cfg, cross=True, name="branch_cross_attention")(
                y_BLD, ctx.encoded, ctx.cross_bias, deterministic=deterministic)
        return out


# model.block_type="evolved" (registered in models/plan.py)
EVOLVED_BLOCK = BlockType("evolved", EvolvedBlock)
