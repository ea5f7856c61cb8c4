"""Fixup's initialization (Zhang et al. 2019, as Narang et al. 2021's fixup.gin configures it):
each residual branch's last projection starts at zero and the projections inside it get He's
init shrunk by a power of the number of branches, so a deep normalization-free stack starts as
the identity map. The scalar shift / scale around each branch: models/residual.py.

As Mesh TF's fixup_layers.py (tensorflow/mesh da907937) with fixup.gin's default_init "he"
and init_distribution "truncated_normal" (TF's variance_scaling, whose truncated normal is
std-corrected as Flax's): self-attention's q / k / v at variance 2 * num_blocks^(-1/3) /
fan_in (AttentionParamsFixup.init_weights, :163-179: m = 4 matrices, num_blocks^(-1/6) on the
std; 0.51 at 60 blocks) and the FFN's wi at 2 / num_blocks / fan_in
(DenseReluDenseFixup.__init__, :296-298: m = 2; 0.033). The gin's decoder cross-attention is
EncDecAttentionFixup (:392-405), which builds the plain AttentionParams (transformer_layers.py
enc_dec_attention, :729): its projections keep the model's init and its output projection does
not start at zero. Odd, and followed.
"""

from __future__ import annotations

import flax.linen as nn

# the projection that ends each residual branch (zero at init) and the ones inside it
BRANCH_OUTPUTS = ("out", "wo")
BRANCH_INPUTS = ("query", "key", "value", "wi", "wi_0", "wi_1")
ATTENTION_INPUTS = ("query", "key", "value")


def num_branches(cfg) -> int:
    """Residual branches in the model: 2 per encoder layer (attention, MLP), 3 per decoder
    layer with cross-attention, else 2 (the gin's num_blocks = 60 for 12 + 12 layers)."""
    if cfg.architecture == "encoder_only":
        return 2 * cfg.num_encoder_layers
    if cfg.architecture == "encoder_decoder":
        return 2 * cfg.num_encoder_layers + 3 * cfg.num_decoder_layers
    return 2 * cfg.num_decoder_layers


def dense_fields(cfg, name: str, fields: dict, cross: bool = False) -> dict:
    """A residual branch's DenseGeneral fields under Fixup: its output projection (``out``,
    ``wo``) starts at zero; the projections inside it get He's init (variance 2 / fan_in)
    times L ** (-2 / (2m - 2)) on the variance (Fixup's L ** (-1 / (2m - 2)) on the std; L
    branches, m = 4 in attention, 2 in the FFN), the query's std also over sqrt(head_dim)
    where T5 folds the logits' scaling into its init (Mesh TF refuses that combination).
    Cross-attention (``cross``) is left as it is, as in the reference."""
    if not cfg.fixup or cross:
        return fields
    if name in BRANCH_OUTPUTS:
        return dict(fields, init=nn.initializers.zeros)
    if name in BRANCH_INPUTS:
        matrices = 4 if name in ATTENTION_INPUTS else 2
        scale = 2.0 * max(num_branches(cfg), 1) ** (-2.0 / (2 * matrices - 2))
        if name == "query" and not cfg.scale_attn_logits:
            scale /= cfg.head_dim  # the std over sqrt(head_dim), as layers.query_init_scale
        return dict(fields, init=nn.initializers.variance_scaling(
            scale, "fan_in", "truncated_normal"))
    return fields
