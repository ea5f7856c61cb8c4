"""Fixup's initialization (Zhang et al. 2019, as Narang et al. 2021's fixup.gin configures it):
each residual branch's last projection starts at zero and the projections inside it get He's
init shrunk by the number of branches, so a deep normalization-free stack starts as the
identity map. The scalar shift / scale around each branch: models/residual.py.
"""

from __future__ import annotations

import flax.linen as nn

# the projection that ends each residual branch (zero at init) and the ones inside it
BRANCH_OUTPUTS = ("out", "wo")
BRANCH_INPUTS = ("query", "key", "value", "wi", "wi_0", "wi_1")


def num_branches(cfg) -> int:
    """Residual branches in the model: 2 per encoder layer (attention, MLP), 3 per decoder
    layer with cross-attention, else 2 (the gin's num_blocks = 60 for 12 + 12 layers)."""
    if cfg.architecture == "encoder_only":
        return 2 * cfg.num_encoder_layers
    if cfg.architecture == "encoder_decoder":
        return 2 * cfg.num_encoder_layers + 3 * cfg.num_decoder_layers
    return 2 * cfg.num_decoder_layers


def dense_fields(cfg, name: str, fields: dict) -> dict:
    """A residual branch's DenseGeneral fields under Fixup: its output projection (``out``,
    ``wo``) starts at zero; the projections inside it get He's init (variance 2 / fan_in)
    divided by the number of branches (Fixup's L ** (-1 / (2m - 2)) on the std, m = 2), the
    query also by sqrt(head_dim) where T5 folds the logits' scaling into its init."""
    if not cfg.fixup:
        return fields
    if name in BRANCH_OUTPUTS:
        return dict(fields, init=nn.initializers.zeros)
    if name in BRANCH_INPUTS:
        scale = 2.0 / max(num_branches(cfg), 1)
        if name == "query" and not cfg.scale_attn_logits:
            scale *= cfg.head_dim ** -0.5
        return dict(fields, init=nn.initializers.variance_scaling(
            scale, "fan_in", "truncated_normal"))
    return fields
