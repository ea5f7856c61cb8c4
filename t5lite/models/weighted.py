"""Weighted Transformer (Ahmed et al. 2017) as the paper codebase built it (Mesh TensorFlow
BranchedSelfAttention / BranchedEncDecAttention): each head h keeps its own output projection
[K, D]; its output is scaled by kappa_h, sent through one FFN shared by the heads, scaled by
alpha_h and summed over heads. The block then has no separate FFN sub-layer (every attention
sub-layer, self and cross, carries one). kappa and alpha start U[0, 1) and scale the branches
as they are, unconstrained: the reference declares a constraint on them (relu, then divide by
the sum: Ahmed et al.'s non-negative weights summing to 1), but a variable constraint is a
TensorFlow-optimizer feature and Mesh TF's optimizers assign their updates without it (no
Mesh TF code reads it), so the paper's runs used the raw variables, as this does.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from t5lite.models import layers as L


class BranchedOutput(nn.Module):
    """Per-head output projections, kappa, the shared FFN and alpha: [B, T, H, K] -> [B, T, D].
    Params: out [H, K, D], kappa [H], alpha [H], wi (or wi_0, wi_1) [D, F], wo [F, D]."""

    cfg: object

    @nn.compact
    def __call__(self, heads_BTHK, deterministic=True):
        cfg = self.cfg
        dtype = L.compute_dtype(cfg)
        h, k = heads_BTHK.shape[-2:]
        d, f = cfg.d_model, cfg.d_ff
        out = self._kernel("out", (h, k, d), ("heads", "kv", "embed"), h * k)
        o_BTHD = jnp.einsum("bthk,hkd->bthd", heads_BTHK.astype(dtype), out.astype(dtype))
        kappa_H, alpha_H = (self.param(n, nn.with_logical_partitioning(
            nn.initializers.uniform(1.0), ("heads",)), (h,), jnp.float32).astype(dtype)
            for n in ("kappa", "alpha"))
        o_BTHD = o_BTHD * kappa_H[:, None]
        names = ("wi_0", "wi_1") if cfg.ffn in L.GATED else ("wi",)
        hidden = [self._dense(o_BTHD, n, (d, f), ("embed", "mlp")) for n in names]
        act = L.ACTIVATIONS[cfg.ffn]
        h_BTHF = act(hidden[0]) * hidden[1] if len(hidden) == 2 else act(hidden[0])
        h_BTHF = nn.Dropout(cfg.dropout_rate)(h_BTHF, deterministic=deterministic)
        o_BTHD = self._dense(h_BTHF, "wo", (f, d), ("mlp", "embed"))
        out_BTD = jnp.einsum("bthd,h->btd", o_BTHD, alpha_H)
        return L.constrain(out_BTD, ("batch", "length", "embed"))

    def _kernel(self, name, shape, axes, fan_in):
        init = L.kernel_init(self.cfg)
        flat = (fan_in, int(np.prod(shape)) // fan_in)
        return self.param(name, nn.with_logical_partitioning(
            lambda key, shape, dtype=jnp.float32: init(key, flat, dtype).reshape(shape), axes),
            shape, jnp.float32)

    def _dense(self, x, name, shape, axes):
        """x [..., in] . kernel [in, out] (+ bias with model.use_bias), in the compute dtype."""
        dtype = L.compute_dtype(self.cfg)
        kernel = self._kernel(f"{name}_kernel", shape, axes, shape[0])
        y = jnp.einsum("...i,io->...o", x.astype(dtype), kernel.astype(dtype))
        if self.cfg.use_bias or self.cfg.ffn_bias:  # its FFN is Mesh TF's DenseReluDense
            y = y + self.param(f"{name}_bias", nn.with_logical_partitioning(
                nn.initializers.zeros, axes[1:]), shape[1:], jnp.float32).astype(dtype)
        return y


class BranchedAttention(L.MultiHeadAttention):
    """Multi-head attention whose heads are combined by BranchedOutput (named "branches")."""

    def combine_heads(self, out_BTHK, shared, deterministic):
        return BranchedOutput(self.cfg, name="branches")(out_BTHK, deterministic)
