"""Product key memory (Lample et al. 2019) in place of a layer's FFN (model.ffn_layer="pkm").

Shapes: B batch, L length, D embed, H memory heads, N sub-keys per half (model.pkm_keys; the
memory has N^2 slots), K half the query width, k slots read per head (model.pkm_knn). As the
paper codebase's ProductKeyValueMemory (Mesh TensorFlow memory_layers.py): a biased query
projection to [H, 2, K] with a layer norm over K, each half scored against its own N sub-keys,
the top k of each half combined into k^2 candidate slots (score = sum of the halves' scores,
slot = i1 * N + i2) of which the top k are read; the output is the softmax(score)-weighted
sum of their values, summed over heads. Only k of N^2 values are touched per token and head.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import layers as L
from t5lite.models.registry import FFNLayer


def product_topk(scores_BLH2N, knn: int):
    """Top ``knn`` slots of the product keys: (scores [B, L, H, knn], slots [B, L, H, knn])
    from the two halves' sub-key scores."""
    n = scores_BLH2N.shape[-1]
    half_s, half_i = jax.lax.top_k(scores_BLH2N, knn)  # [B, L, H, 2, knn]
    all_s = half_s[..., 0, :, None] + half_s[..., 1, None, :]
    all_i = half_i[..., 0, :, None] * n + half_i[..., 1, None, :]
    flat = all_s.shape[:-2] + (knn * knn,)
    best_s, best = jax.lax.top_k(all_s.reshape(flat), knn)
    return best_s, jnp.take_along_axis(all_i.reshape(flat), best, axis=-1)


# The reference's initializers (mesh_tensorflow/transformer/memory_layers.py
# ProductKeyValueMemory.call, :54-64 at da907937): the keys are an mtf.get_variable with no
# initializer, which is TF's glorot_uniform (ops.py get_variable; fans over the last two dims
# times the leading ones, as Flax's variance_scaling computes them), and the values are
# mtf.layers.embedding_weights, N(0, 1) (layers.py :2062-2063); Lample et al. draw the values
# N(0, d^-1/2). Their query is an mtf.layers.dense: layers.kernel_init.
KEYS_MESH_TF = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")


class ProductKeyMemory(nn.Module):
    """Params: query/{kernel [D, H*2*K], bias}, query_norm_scale / _bias [K], keys
    [H, 2, N, K] ("heads", None, "memory_keys", "kv"), values [N^2, D] ("memory", "embed")."""

    cfg: object

    @nn.compact
    def __call__(self, x_BLD, deterministic=True):
        cfg = self.cfg
        dtype = L.compute_dtype(cfg)
        h, n, half, knn = cfg.pkm_heads, cfg.pkm_keys, cfg.pkm_key_dim // 2, cfg.pkm_knn
        d = x_BLD.shape[-1]
        q_BLH2K = L.DenseGeneral((h, 2, half), ("embed", "heads", None, "kv"), use_bias=True,
                                 dtype=jnp.float32, init=L.kernel_init(cfg),
                                 flat_kernel=cfg.flat_kernels, gradient_rules=cfg.gradient_rules,
                                 name="query")(x_BLD.astype(jnp.float32))
        q_BLH2K = self._layer_norm(q_BLH2K)
        keys = self.param("keys", nn.with_logical_partitioning(
            self._init(nn.initializers.normal(half ** -0.5), KEYS_MESH_TF),
            ("heads", None, "memory_keys", "kv")), (h, 2, n, half), jnp.float32)
        scores_BLH2N = jnp.einsum("blhpk,hpnk->blhpn", q_BLH2K, keys)
        scores_BLHk, slots_BLHk = product_topk(scores_BLH2N, min(knn, n))
        weights_BLHk = jax.nn.softmax(scores_BLHk, axis=-1).astype(dtype)
        values = self.param("values", nn.with_logical_partitioning(
            self._init(nn.initializers.normal(d ** -0.5), nn.initializers.normal(1.0)),
            ("memory", "embed")), (n * n, d), jnp.float32)
        read_BLHkD = jnp.take(values.astype(dtype), slots_BLHk, axis=0)
        out_BLD = jnp.einsum("blhk,blhkd->bld", weights_BLHk, read_BLHkD)
        return L.constrain(out_BLD, ("batch", "length", "embed"))

    def _init(self, own, mesh_tf):
        """Lample et al.'s init, or with model.initializers="mesh_tf" the reference's."""
        return mesh_tf if self.cfg.initializers == "mesh_tf" else own

    def _layer_norm(self, x):
        k = x.shape[-1]
        scale = self.param("query_norm_scale", nn.with_logical_partitioning(
            nn.initializers.ones, ("kv",)), (k,), jnp.float32)
        bias = self.param("query_norm_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, ("kv",)), (k,), jnp.float32)
        x = x - jnp.mean(x, axis=-1, keepdims=True)
        x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6)
        return x * scale + bias


# model.ffn_layer="pkm" (registered in models/plan.py)
PKM = FFNLayer("pkm", ProductKeyMemory)
