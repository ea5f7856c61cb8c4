"""A Block's residual sub-layer, x + branch(x), with the normalization-free variants of Narang et
al. 2021's table: ReZero (the branch times a learned scalar that starts at zero, so every
block is the identity at init; Bachlechner et al. 2020) and Fixup (a scalar shift before and
a scalar scale after each branch; Zhang et al. 2019; its init: models/fixup.py).

Shapes: B batch, L length, D embed.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from t5lite.models import layers as L


def _scalar(module: nn.Module, name: str, init) -> jnp.ndarray:
    """A learned scalar of ``module`` (stacked over layers when the block is scanned)."""
    return module.param(name, nn.with_logical_partitioning(init, ()), (), jnp.float32)


def sublayer(module: nn.Module, cfg, x_BLD, stem: str, fn, deterministic: bool):
    """x + dropout(branch), normalized before (pre_norm) or after; under ReZero the branch is
    scaled by ``<stem>_rezero_alpha`` (0 at init), under Fixup shifted by
    ``<stem>_fixup_bias_in`` and scaled by ``<stem>_fixup_scale``. Called from a Block's
    compact __call__ (``module``), whose params these scalars become."""
    where = "pre" if cfg.pre_norm else "post"
    norm = L.make_norm(cfg, f"{where}_{stem}_layer_norm")
    h_BLD = norm(x_BLD) if cfg.pre_norm else x_BLD
    if cfg.fixup:
        h_BLD = h_BLD + _scalar(module, f"{stem}_fixup_bias_in", nn.initializers.zeros
                                ).astype(h_BLD.dtype)
    y_BLD = L.dropout(cfg)(fn(h_BLD), deterministic=deterministic)
    if cfg.fixup:
        y_BLD = y_BLD * _scalar(module, f"{stem}_fixup_scale", nn.initializers.ones
                                ).astype(y_BLD.dtype)
    if cfg.rezero:
        y_BLD = y_BLD * _scalar(module, f"{stem}_rezero_alpha", nn.initializers.zeros
                                ).astype(y_BLD.dtype)
    y_BLD = x_BLD + y_BLD
    return y_BLD if cfg.pre_norm else norm(y_BLD)


class FinalFixup(nn.Module):
    """Fixup after a stack's last layer (in place of the final norm): a learned scalar shift,
    and in the encoder also a scale (fixup.gin's sublayers_final)."""

    scale: bool = True

    @nn.compact
    def __call__(self, x_BLD):
        x_BLD = x_BLD + _scalar(self, "bias", nn.initializers.zeros).astype(x_BLD.dtype)
        if self.scale:
            x_BLD = x_BLD * _scalar(self, "scale", nn.initializers.ones).astype(x_BLD.dtype)
        return x_BLD
