"""Convolutions over the sequence: lightweight and dynamic convolution (Wu et al. 2019) as
self-attention replacements, and the separable convolution the Evolved Transformer uses.

Every convolution here reads its taps through the layer's attention mask: tap ``r`` of query
``t`` reads slot ``t + r`` only where the mask lets ``t`` see that slot (same packed segment,
not padding, not the future in a decoder), else zero. So packed examples never leak into each
other and a decoder's causal window stays causal whatever its offsets. In decoding the taps
read a cache of every input so far (``LocalInputs``), like attention's KV cache.

Shapes: B batch, T query length, S key / source length, D channels, W taps, G kernel groups.
"""

from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.models import layers as L
from t5lite.models.registry import TokenMixer


def tap_offsets(width: int, causal: bool) -> tuple[int, ...]:
    """Relative source positions of a window of ``width`` taps: centred (an even width leans
    left), or ending at the query itself (causal)."""
    if causal:
        return tuple(range(-(width - 1), 1))
    left = width // 2
    return tuple(range(-left, width - left))


def visible_BTS(bias_BXTS) -> jnp.ndarray:
    """Which source slots each query may read, from an additive attention bias (0 or NEG_INF,
    plus any finite position bias) [B, 1 or H, T, S] -> bool [B, T, S]."""
    return bias_BXTS[:, 0] > L.NEG_INF / 2


class LocalInputs(nn.Module):
    """The sequence a layer reads and the slots of this call's queries in it: this call's
    inputs [B, T, ...] (slots None: the queries are the sequence itself), or in decoding the
    cache of every input so far (written at ``cache_index``; slots cache_index + arange(T))."""

    @nn.compact
    def __call__(self, x_BT_, decode: bool = False, cache_index=None):
        if not decode:
            return x_BT_, None
        initialized = self.has_variable("cache", "cached_input")
        cache = self.variable("cache", "cached_input", jnp.zeros, x_BT_.shape, x_BT_.dtype)
        if not initialized:  # init_cache: shapes only
            return x_BT_, None
        start = (0, cache_index) + (0,) * (x_BT_.ndim - 2)
        cache.value = jax.lax.dynamic_update_slice(
            cache.value, x_BT_.astype(cache.value.dtype), start)
        return cache.value, cache_index + jnp.arange(x_BT_.shape[1])


def shifted(src_BSD, slots_T, visible_BTS, offset: int):
    """For each query slot t, the source at slot t + offset, zero where that slot is outside
    the sequence or hidden from t by the mask. ``slots_T`` None: the queries are the source's
    own slots (a whole sequence at once), so the shift is a static slice, not a gather."""
    t, s = visible_BTS.shape[1], src_BSD.shape[1]
    if slots_T is None:
        idx_T = np.arange(t) + offset
        left, right = max(-offset, 0), max(offset, 0)
        pad = [(0, 0), (left, right)] + [(0, 0)] * (src_BSD.ndim - 2)
        src_BTD = jnp.pad(src_BSD, pad)[:, right:right + t]
    else:
        idx_T = slots_T + offset
    inside_T = (idx_T >= 0) & (idx_T < s)
    idx_T = (np if slots_T is None else jnp).clip(idx_T, 0, s - 1)
    seen_BT = visible_BTS[:, np.arange(t), idx_T] & inside_T[None]
    if slots_T is not None:
        src_BTD = jnp.take(src_BSD, idx_T, axis=1)
    return src_BTD * seen_BT[..., None].astype(src_BSD.dtype)


def depthwise(src_BSD, slots_T, visible_BTS, offsets, weights_XW_D):
    """sum over taps w of weights[..., w, :] * shifted(src, w): a depthwise convolution whose
    weights are [W, D] (one kernel for all positions) or [B, T, W, D] (one per position)."""
    out_BTD = 0.0
    for w, offset in enumerate(offsets):
        out_BTD = out_BTD + shifted(src_BSD, slots_T, visible_BTS, offset) * weights_XW_D[
            ..., w, :]
    return out_BTD


def expand_groups(w_XG, channels: int):
    """Kernel groups -> channels: channel c uses group c // (channels / G), so each group's
    kernel is shared by a block of consecutive channels (Wu et al.'s weight tying)."""
    return jnp.repeat(w_XG, channels // w_XG.shape[-1], axis=-1)


class LocalConvolution(nn.Module):
    """Lightweight (``model.attention_type=lightweight_conv``) or dynamic (``dynamic_conv``)
    convolution in place of self-attention, called like MultiHeadAttention.

    GLU on the input (``glu_linear`` * sigmoid(``glu_gate``)), a separable convolution (a
    depthwise one over ``model.conv_kernel_size`` taps, centred in an encoder and ending at the
    query in a decoder, whose weights are softmax-normalised over the taps; then ``pointwise``,
    a dense layer with a bias, as the paper's reference), then the ``out`` projection. The
    lightweight kernel is a parameter; the dynamic one is predicted from each position's input
    (``kernel_predictor``). ``model.conv_heads`` = G kernels, each shared by D / G consecutive
    channels; 0 = one kernel per channel.
    """

    cfg: object
    causal: bool = False

    @nn.compact
    def __call__(self, x_BTD, kv_BSD, bias_BHTS, rope_pos_BT=None, deterministic=True,
                 decode=False, cache_index=None):
        cfg = self.cfg
        d, width = cfg.d_model, cfg.conv_kernel_size
        groups = cfg.conv_heads or d
        dense = lambda n, f, axes: L.make_dense(cfg, f, axes, cfg.use_bias, name=n)  # noqa: E731
        gate_BTD = nn.sigmoid(dense("glu_gate", d, ("embed", "mlp"))(x_BTD))
        glu_BTD = dense("glu_linear", d, ("embed", "mlp"))(x_BTD) * gate_BTD
        glu_BTD = L.constrain(glu_BTD, ("batch", "length", "mlp"))
        src_BSD, slots_T = LocalInputs(name="inputs")(glu_BTD, decode, cache_index)
        if cfg.attention_type == "dynamic_conv":
            logits_BTX = dense("kernel_predictor", width * groups, ("embed", "mlp"))(glu_BTD)
            logits_BTWG = logits_BTX.reshape(logits_BTX.shape[:2] + (width, groups))
        else:
            logits_BTWG = self.param("kernel", nn.with_logical_partitioning(
                nn.initializers.normal(1.0), (None, None)), (width, groups), jnp.float32)
        weights_XWG = jax.nn.softmax(logits_BTWG.astype(jnp.float32), axis=-2)
        weights_XWD = expand_groups(weights_XWG.astype(L.compute_dtype(cfg)), d)
        self.sow("intermediates", "conv_weights", weights_XWD)
        conv_BTD = depthwise(src_BSD, slots_T, visible_BTS(bias_BHTS),
                             tap_offsets(width, self.causal), weights_XWD)
        conv_BTD = L.make_dense(cfg, d, ("mlp", "embed"), True, name="pointwise")(conv_BTD)
        out_BTD = dense("out", d, ("embed", "mlp"))(conv_BTD)
        return L.constrain(out_BTD, ("batch", "length", "embed"))


class SeparableConv(nn.Module):
    """Depthwise convolution (one plain kernel per channel over the taps ``offsets``) then a
    pointwise dense layer to ``features`` with a bias: the Evolved Transformer's separable
    convolution, ``activation`` after."""

    cfg: object
    features: int
    offsets: tuple
    activation: Optional[str] = None  # "relu" or None

    @nn.compact
    def __call__(self, x_BTD, visible_BTS, decode=False, cache_index=None):
        cfg = self.cfg
        d = x_BTD.shape[-1]
        src_BSD, slots_T = LocalInputs(name="inputs")(x_BTD, decode, cache_index)
        kernel_WD = self.param("depthwise", nn.with_logical_partitioning(
            nn.initializers.normal(len(self.offsets) ** -0.5), (None, "mlp")),
            (len(self.offsets), d), jnp.float32)
        y_BTD = depthwise(src_BSD, slots_T, visible_BTS, self.offsets,
                          kernel_WD.astype(L.compute_dtype(cfg)))
        y_BTF = L.make_dense(cfg, self.features, ("mlp", "embed"), True, name="pointwise")(y_BTD)
        return nn.relu(y_BTF) if self.activation == "relu" else y_BTF


# model.attention_type=lightweight_conv / dynamic_conv (registered in models/plan.py): the
# window ends at the query in a decoder (causal); arrays backend only
CONVOLUTION = TokenMixer(("lightweight_conv", "dynamic_conv"),
                         lambda attention_cls, causal, backend: functools.partial(
                             LocalConvolution, causal=causal))
