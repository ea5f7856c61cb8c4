"""Synthesizer attention (Tay et al. 2020) in the seven forms Narang et al. 2021 compare.

The attention logits are synthesized instead of (or besides) the query-key dot product:

- dense: a per-head query projection of each token, relu, then a [K, max_length] matrix
  (``pi``, shared by the heads) gives that token's logits over the key slots: they depend
  only on the query token itself;
- random: a learned [max_length, H, max_length] matrix ``R``: logits that do not depend on
  the input at all;
- factorized, as the paper's reference computes it (Mesh TF's synthetic_attention): factors
  R1, R2 of [k, H, max_length] multiplied elementwise and summed over k give [H, S] logits,
  the same for every query. The reference's einsum asks for a [length, H, memory_length]
  output from inputs without a length axis, which Mesh TF broadcasts: a learned distribution
  over the key slots per head (the position bias still differs per query), not Tay et al.'s
  rank-k [L, L] matrix R1 R2^T;
- "plus": the synthesized logits added to the dot-product logits; "plus alpha": mixed as
  (1 - a) dot + a synth with a = sigmoid(alpha), alpha a learned scalar starting at 0.

As in the paper's Mesh TensorFlow reference, the relative position bias and the masks are
added after, and rows / columns of R are the query / key slots (the cache slot in decoding),
so sequences are at most ``model.max_length`` long.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from t5lite.errors import UserError
from t5lite.models import layers as L
from t5lite.models.local_conv import LocalInputs
from t5lite.models.registry import TokenMixer

SYNTHESIZERS = ("synthesizer_dense", "synthesizer_dense_plus", "synthesizer_dense_plus_alpha",
                "synthesizer_factorized", "synthesizer_random", "synthesizer_random_plus",
                "synthesizer_random_plus_alpha")


class SynthesizerAttention(L.MultiHeadAttention):
    """Self-attention with synthesized logits (``model.attention_type=synthesizer_*``),
    called like MultiHeadAttention; decoding caches the values (and keys in the plus forms)."""

    @nn.compact
    def __call__(self, x_BTD, kv_BSD, bias_BHTS, rope_pos_BT=None, deterministic=True,
                 decode=False, cache_index=None):
        cfg = self.cfg
        mode = cfg.attention_type.removeprefix("synthesizer_")
        dtype = L.compute_dtype(cfg)
        shared = dict(use_bias=cfg.use_bias, dtype=dtype, init=L.attention_init(cfg),
                      flat_kernel=cfg.flat_kernels, gradient_rules=cfg.gradient_rules)
        projection = dict(shared, features=(cfg.num_heads, cfg.head_dim),
                          kernel_axes=("embed", "heads", "kv"))
        q_BTHK = None
        if mode.startswith("dense") or "plus" in mode:
            q_BTHK = self.dense_layer("query", **dict(
                projection, init=L.attention_init(cfg, L.query_init_scale(cfg))))(x_BTD)
        v_BSHK, slots_T = LocalInputs(name="value_cache")(
            self.dense_layer("value", **projection)(kv_BSD), decode, cache_index)
        s = v_BSHK.shape[1]
        if s > cfg.max_length:
            raise UserError(f"attention_type={cfg.attention_type} synthesizes logits for at "
                            f"most model.max_length={cfg.max_length} slots, got {s}: raise "
                            "model.max_length or shorten the sequences.")
        synth_XHTS = self.synthesized(mode, q_BTHK, slots_T, x_BTD.shape[1], s, dtype)
        if "plus" in mode:
            k_BSHK, _ = LocalInputs(name="key_cache")(
                self.dense_layer("key", **projection)(kv_BSD), decode, cache_index)
            if cfg.scale_attn_logits:
                q_BTHK = q_BTHK * jnp.asarray(cfg.head_dim ** -0.5, dtype)
            dot_BHTS = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BSHK).astype(jnp.float32)
            if mode.endswith("alpha"):
                alpha = nn.sigmoid(self.param("alpha", nn.with_logical_partitioning(
                    nn.initializers.zeros, (None,)), (1,), jnp.float32))
                synth_XHTS = (1.0 - alpha) * dot_BHTS + alpha * synth_XHTS
            else:
                synth_XHTS = dot_BHTS + synth_XHTS
        weights_BHTS = L.softmax_to(synth_XHTS + bias_BHTS, dtype)
        self.sow("intermediates", "attention_weights", weights_BHTS)
        weights_BHTS = nn.Dropout(cfg.dropout_rate)(weights_BHTS, deterministic=deterministic)
        out_BTHK = jnp.einsum("bhts,bshk->bthk", weights_BHTS, v_BSHK.astype(dtype))
        out_BTD = self.dense_layer("out", features=(cfg.d_model,), n_in=2,
                                   kernel_axes=("heads", "kv", "embed"), **shared)(out_BTHK)
        return L.constrain(out_BTD, ("batch", "length", "embed"))

    def synthesized(self, mode, q_BTHK, slots_T, q_len: int, s: int, dtype):
        """The synthesized logits, float32: [B, H, T, S] (dense) or [1, H, T, S] (random)."""
        cfg = self.cfg
        n, h = cfg.max_length, cfg.num_heads
        if mode.startswith("dense"):
            pi_KN = self.param("pi", nn.with_logical_partitioning(
                L.kernel_init(cfg), ("kv", "abspos")), (cfg.head_dim, n), jnp.float32)
            return jnp.einsum("bthk,ks->bhts", nn.relu(q_BTHK),
                              pi_KN[:, :s].astype(dtype)).astype(jnp.float32)
        init = nn.initializers.glorot_uniform()
        # the queries' rows: their slots (decoding) or the first T (a whole sequence)
        rows = lambda r: r[:q_len] if slots_T is None else r[slots_T]  # noqa: E731
        if mode == "factorized":  # (glorot over [k, H, N], as TF's default initializer)
            r1_KHN, r2_KHN = [self.param(name, nn.with_logical_partitioning(
                init, (None, "heads", "abspos")), (cfg.synthesizer_rank, h, n), jnp.float32)
                for name in ("R1", "R2")]
            r_HS = jnp.einsum("khs,khs->hs", r1_KHN[:, :, :s], r2_KHN[:, :, :s])
            r_HTS = jnp.broadcast_to(r_HS[:, None], (h, q_len, s))
        else:
            r_NHN = self.param("R", nn.with_logical_partitioning(
                init, ("abspos", "heads", None)), (n, h, n), jnp.float32)
            r_HTS = jnp.transpose(rows(r_NHN)[:, :, :s], (1, 0, 2))
        return r_HTS[None]


# model.attention_type=synthesizer_* (registered in models/plan.py); arrays backend only
SYNTHESIZER = TokenMixer(SYNTHESIZERS, lambda attention_cls, causal, backend:
                         SynthesizerAttention)
