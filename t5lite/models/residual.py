"""A Block's residual sub-layer, x + branch(x), with the normalization-free variants of Narang et
al. 2021's table: ReZero (the branch times a learned scalar that starts at zero, so every
block is the identity at init; Bachlechner et al. 2020) and Fixup (a scalar shift before and
a scalar scale after each branch; Zhang et al. 2019; its init: models/fixup.py).

Shapes: B batch, L length, D embed.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from t5lite.models import layers as L
from t5lite.models.sharing import GRUGate


@dataclasses.dataclass(frozen=True)
class Arrangement:
    """How a Block's residual sub-layers are arranged: the norm before (``pre_norm``) or after
    the residual add, Fixup's and ReZero's scalars, and the Universal Transformer's ``gate``
    of the branch's output against its input (sharing.GRUGate; None = no gate)."""

    pre_norm: bool = True
    fixup: bool = False
    rezero: bool = False
    gate: Optional[type] = None


def arrangement(cfg) -> Arrangement:
    """The arrangement model.pre_norm, fixup, rezero and universal_gating choose."""
    return Arrangement(pre_norm=cfg.pre_norm, fixup=cfg.fixup, rezero=cfg.rezero,
                       gate=GRUGate if cfg.universal_gating == "gru" else None)


def _scalar(module: nn.Module, name: str, init) -> jnp.ndarray:
    """A learned scalar of ``module`` (stacked over layers when the block is scanned)."""
    return module.param(name, nn.with_logical_partitioning(init, ()), (), jnp.float32)


def sublayer(module: nn.Module, cfg, x_BLD, stem: str, fn, deterministic: bool,
             how: Optional[Arrangement] = None):
    """x + dropout(branch), normalized before (pre_norm) or after; under ReZero the branch is
    scaled by ``<stem>_rezero_alpha`` (0 at init), under Fixup shifted by
    ``<stem>_fixup_bias_in`` and scaled by ``<stem>_fixup_scale``; with a gate the branch's
    output is gated against ``x_BLD`` (params ``<stem>_gate``). Called from a Block's compact
    __call__ (``module``), whose params these become. ``how``: the Arrangement (default:
    ``arrangement(cfg)``)."""
    how = how or arrangement(cfg)
    if how.gate is not None:
        branch = fn
        fn = lambda h_BLD: how.gate(cfg, name=f"{stem}_gate")(x_BLD, branch(h_BLD))  # noqa
    where = "pre" if how.pre_norm else "post"
    norm = L.make_norm(cfg, f"{where}_{stem}_layer_norm")
    h_BLD = norm(x_BLD) if how.pre_norm else x_BLD
    if how.fixup:
        h_BLD = h_BLD + _scalar(module, f"{stem}_fixup_bias_in", nn.initializers.zeros
                                ).astype(h_BLD.dtype)
    y_BLD = L.dropout(cfg)(fn(h_BLD), deterministic=deterministic)
    if how.fixup:
        y_BLD = y_BLD * _scalar(module, f"{stem}_fixup_scale", nn.initializers.ones
                                ).astype(y_BLD.dtype)
    if how.rezero:
        y_BLD = y_BLD * _scalar(module, f"{stem}_rezero_alpha", nn.initializers.zeros
                                ).astype(y_BLD.dtype)
    y_BLD = x_BLD + y_BLD
    return y_BLD if how.pre_norm else norm(y_BLD)


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
