"""ALBERT's factorized token embedding (Lan et al. 2020), as Narang et al. 2021 used it: a
[V, E] table and an [E, D] projection (E = model.factorized_embed_dim), so the vocabulary
costs V E + E D parameters instead of V D. The tied softmax runs the projection backwards:
logits = (x P^T) T^T.

Shapes: B batch, L length, V vocab, E factorized width, D d_model.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from t5lite.models import layers as L


class FactorizedEmbed(nn.Module):
    """Token ids -> [B, L, D] through ``embedding`` [V, E] and ``project`` [E, D]; ``attend``
    is the tied output projection over both."""

    cfg: object

    def setup(self):
        cfg = self.cfg
        self.table = L.make_embed(cfg, cfg.vocab_size, cfg.factorized_embed_dim,
                                  ("vocab", None))
        self.project = self.param("project", nn.with_logical_partitioning(
            L.kernel_init(cfg), (None, "embed")),
            (cfg.factorized_embed_dim, cfg.d_model), jnp.float32)

    def __call__(self, ids_BL):
        dtype = L.compute_dtype(self.cfg)
        return jnp.einsum("ble,ed->bld", self.table(ids_BL), self.project.astype(dtype))

    def attend(self, x_BLD):
        dtype = L.compute_dtype(self.cfg)
        h_BLE = jnp.einsum("bld,ed->ble", x_BLD.astype(dtype), self.project.astype(dtype))
        return self.table.attend(h_BLE)
