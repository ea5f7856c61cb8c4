"""Building blocks: dense / embedding with logical axes, norms, position schemes, attention, MLP.

Shapes: B batch, L / T query length, S key length, D embed, H heads, K head dim, F mlp, V vocab.
Every parameter is boxed with its logical axis names (nn.with_logical_partitioning); large
activations are constrained with nn.with_logical_constraint. Params are float32; computation
runs in ``dtype`` (softmax and norms in float32).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

NEG_INF = -1e10  # additive mask value (finite: fully masked rows stay NaN-free)

Axes = tuple[str, ...]


def compute_dtype(cfg) -> jnp.dtype:
    return jnp.dtype(cfg.dtype)


# The platform the step is traced for. jax.default_backend() is "cpu" on a CPU host that
# compiles for an abstract TPU topology (t5lite.tpu.aot), so that command sets it explicitly.
_TARGET_PLATFORM = contextvars.ContextVar("t5lite_target_platform", default=None)


@contextlib.contextmanager
def target_platform(platform: str):
    """Trace model code for `platform` ("cpu", "tpu", "gpu") whatever the default backend is."""
    token = _TARGET_PLATFORM.set(platform)
    try:
        yield
    finally:
        _TARGET_PLATFORM.reset(token)


def cpu_gradients() -> bool:
    """The hand-written gradients below exist for XLA:CPU only; elsewhere autodiff's own form
    leaves XLA (TPU, GPU) free to fuse and lay out the matmuls as it likes."""
    return (_TARGET_PLATFORM.get() or jax.default_backend()) == "cpu"


def recompute_in_backward(fn):
    """``fn`` (elementwise: a norm, an activation) whose backward pass recomputes its inside
    from its inputs instead of keeping every intermediate (jax.checkpoint). Autodiff keeps
    them all: an RMSNorm three float32 copies of its [B, L, D] input, tanh-GeLU five [B, L, F]
    arrays. XLA drops such residuals itself when the layers are unrolled, but not across a
    scanned layer's loop boundary, where they become stacked [layers, ...] buffers (T5 base,
    16 x 512 tokens per chip: ~0.4 GiB per layer). Off on CPU, where memory is not the limit
    and the recompute would cost step time."""
    return fn if cpu_gradients() else jax.checkpoint(fn)


def dot(x, w, n_in: int = 1, tied: bool = False):
    """x [..., *in] . w [*in, *out] (tied: x [..., D] . w^T with w = E [V, D])."""
    if cpu_gradients():
        return dense_dot(x, w, n_in, tied)
    if tied:
        return jnp.einsum("...d,vd->...v", x, w)
    contract = tuple(range(x.ndim - n_in, x.ndim))
    return jax.lax.dot_general(x, w, ((contract, tuple(range(n_in))), ((), ())))


def constrain(x, axes: Axes):
    return nn.with_logical_constraint(x, axes)


def kernel_init(cfg, scale: float = 1.0) -> Callable:
    """T5X: truncated-normal fan-in init (times ``scale``); BERT/GPT-2: N(0, init_std)."""
    if cfg.init_std > 0:
        return nn.initializers.normal(cfg.init_std)
    return nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")


def embed_init(cfg) -> Callable:
    return nn.initializers.normal(cfg.init_std if cfg.init_std > 0 else 1.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def dense_dot(x, w, n_in: int = 1, tied: bool = False):
    """x [..., *in] . w [*in, *out], contracting x's trailing n_in dims; tied: x [..., D] . w^T
    with w = E [V, D] (the tied output layer).

    Same math as dot_general (used on CPU only, see ``dot``); the hand-written gradient computes
    dw as one 2-D matmul with the [tokens, *out] output gradient as the left operand,
    contracting its major (token) axis. Autodiff's form makes XLA:CPU first copy that gradient
    into a transposed [*out, tokens] buffer (for the vocabulary projection the largest tensor of
    a train step, which made the output layer several times slower than the model body; in every
    layer, the MLP's).
    """
    if tied:
        return jnp.einsum("...d,vd->...v", x, w)
    contract = tuple(range(x.ndim - n_in, x.ndim))
    return jax.lax.dot_general(x, w, ((contract, tuple(range(n_in))), ((), ())))


def _dense_dot_fwd(x, w, n_in, tied):
    return dense_dot(x, w, n_in, tied), (x, w)


def _dense_dot_bwd(n_in, tied, res, g):
    x, w = res
    if tied:
        dx = jnp.einsum("...v,vd->...d", g, w)
        n_in, n_out = 1, 1
    else:
        n_out = w.ndim - n_in
        dx = jax.lax.dot_general(g, w, ((tuple(range(g.ndim - n_out, g.ndim)),
                                         tuple(range(n_in, w.ndim))), ((), ())))
    x_NI = x.reshape(-1, math.prod(x.shape[x.ndim - n_in:]))
    g_NO = g.reshape(-1, math.prod(g.shape[g.ndim - n_out:]))
    dw_OI = jax.lax.dot_general(g_NO, x_NI, (((0,), (0,)), ((), ())))
    dw = dw_OI if tied else dw_OI.T.reshape(w.shape)
    return dx.astype(x.dtype), dw.astype(w.dtype)


dense_dot.defvjp(_dense_dot_fwd, _dense_dot_bwd)


class DenseGeneral(nn.Module):
    """y = x . W (+ b) contracting the trailing ``len(in_axes)`` dims of x into ``features``.

    The kernel is initialised as a 2-D (fan_in, fan_out) matrix, so fan-in is the product of
    the contracted dims (as in T5X), and with ``flat_kernel`` (model.flat_kernels) also stored
    so, reshaped to [in..., out...] in the layer; its two logical axes are the first named
    axis of each group (the major one: sharding it shards the joined dim the same way).
    Without it the param has the [in..., out...] shape. ``lora_rank`` > 0 adds the layer's
    optional low-rank update (alpha / r) (x A) B (Hu et al., 2021) with params ``lora_a``
    [in..., r] (fan-in init) and ``lora_b`` [r, out...] (zeros, so the layer starts as the
    plain one), [fan_in, r] and [r, fan_out] with ``flat_kernel``.
    """

    features: Sequence[int]
    kernel_axes: Axes  # logical names of the kernel: contracted dims then feature dims
    n_in: int = 1  # how many trailing input dims are contracted
    use_bias: bool = False
    dtype: jnp.dtype = jnp.float32
    init: Callable = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
    lora_rank: int = 0
    lora_alpha: float = 0.0
    flat_kernel: bool = True

    @nn.compact
    def __call__(self, x):
        features = tuple(self.features)
        in_shape = x.shape[-self.n_in:]
        shape = in_shape + features
        flat = (int(np.prod(in_shape)), int(np.prod(features)))

        def init_fn(key, shape, dtype=jnp.float32):
            return self.init(key, flat, dtype).reshape(shape)

        (in_dims, in_axes), (out_dims, out_axes) = self._stored(in_shape, features)
        kernel = self.param("kernel", nn.with_logical_partitioning(init_fn, in_axes + out_axes),
                            in_dims + out_dims, jnp.float32).reshape(shape)
        x = x.astype(self.dtype)
        y = dot(x, kernel.astype(self.dtype), self.n_in)
        if self.use_bias:
            bias = self.param("bias", nn.with_logical_partitioning(
                nn.initializers.zeros, self.kernel_axes[self.n_in:]), features, jnp.float32)
            y = y + bias.astype(self.dtype)
        if self.lora_rank:
            y = y + self._low_rank(x, in_shape, features)
        return y

    def _stored(self, in_shape, features):
        """How the params store the contracted and the feature dims: ((dims, logical axes) of
        the input side, (dims, axes) of the output side); with flat_kernel each side is one
        dim named by its first named axis (the major one)."""
        axes = tuple(self.kernel_axes)
        sides = ((tuple(in_shape), axes[:self.n_in]), (tuple(features), axes[self.n_in:]))
        if not self.flat_kernel:
            return sides
        return tuple(((int(np.prod(dims)),), (next((a for a in names if a is not None), None),))
                     for dims, names in sides)

    def _low_rank(self, x, in_shape, features):
        rank = self.lora_rank
        (in_dims, in_axes), (out_dims, out_axes) = self._stored(in_shape, features)

        def a_init(key, shape, dtype=jnp.float32):
            flat = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")(
                key, (int(np.prod(in_shape)), rank), dtype)
            return flat.reshape(shape)

        a = self.param("lora_a", nn.with_logical_partitioning(a_init, in_axes + (None,)),
                       in_dims + (rank,), jnp.float32).reshape(in_shape + (rank,))
        b = self.param("lora_b", nn.with_logical_partitioning(
            nn.initializers.zeros, (None,) + out_axes), (rank,) + out_dims,
            jnp.float32).reshape((rank,) + features)
        contract = tuple(range(x.ndim - self.n_in, x.ndim))
        h = jax.lax.dot_general(x, a.astype(self.dtype),
                                ((contract, tuple(range(self.n_in))), ((), ())))
        y = jnp.tensordot(h, b.astype(self.dtype), axes=1)
        return y * jnp.asarray(self.lora_alpha / rank, self.dtype)


class Embed(nn.Module):
    """Lookup table [num, D]; ``attend`` gives the tied output projection x . E^T."""

    num_embeddings: int
    features: int
    axes: Axes = ("vocab", "embed")
    dtype: jnp.dtype = jnp.float32
    init: Callable = nn.initializers.normal(1.0)

    def setup(self):
        self.embedding = self.param(
            "embedding", nn.with_logical_partitioning(self.init, self.axes),
            (self.num_embeddings, self.features), jnp.float32)

    def __call__(self, ids):
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x):
        return dot(x.astype(self.dtype), self.embedding.astype(self.dtype), 1, True)


class Norm(nn.Module):
    """RMSNorm (T5: scale only, no mean subtraction) or LayerNorm (scale and bias)."""

    kind: str = "rmsnorm"
    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        scale = self.param("scale", nn.with_logical_partitioning(
            nn.initializers.ones, ("embed",)), (d,), jnp.float32)
        bias = None
        if self.kind == "layernorm":
            bias = self.param("bias", nn.with_logical_partitioning(
                nn.initializers.zeros, ("embed",)), (d,), jnp.float32)
        return recompute_in_backward(self._normalize)(x, scale, bias)

    def _normalize(self, x, scale, bias):
        x32 = x.astype(jnp.float32)
        if self.kind == "layernorm":
            x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        y = y * scale
        if bias is not None:
            y = y + bias
        return y.astype(self.dtype)


def make_norm(cfg, name: str) -> Norm:
    return Norm(kind=cfg.norm, eps=cfg.norm_eps, dtype=compute_dtype(cfg), name=name)


# ----------------------------------------------------------------------------- positions


def sinusoidal(positions_BL, d: int, max_wavelength: float = 10000.0):
    """Fixed [sin | cos] position encodings (Vaswani et al.), shape [B, L, d]."""
    half = d // 2
    inv_freq = max_wavelength ** (-np.arange(half, dtype=np.float32) / max(half - 1, 1))
    angle = positions_BL[..., None].astype(jnp.float32) * inv_freq
    return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


def apply_rope(x_BLHK, positions_BL, max_wavelength: float = 10000.0):
    """Rotary embedding (rotate-half form) over the full head dim."""
    k = x_BLHK.shape[-1]
    inv_freq = max_wavelength ** (-np.arange(0, k, 2, dtype=np.float32) / k)
    angle = positions_BL[..., None].astype(jnp.float32) * inv_freq  # [B, L, K/2]
    sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]
    x1, x2 = jnp.split(x_BLHK.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BLHK.dtype)


def alibi_bias(q_pos_BQ, k_pos_BS, num_heads: int):
    """ALiBi: -slope_h * |q - k|, geometric slopes (Press et al.); shape [B, H, Q, S]."""
    def slopes(n):
        start = 2 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    p = 2 ** math.floor(math.log2(num_heads))
    s = slopes(p) + slopes(2 * p)[0::2][:num_heads - p]
    dist = jnp.abs(q_pos_BQ[:, :, None] - k_pos_BS[:, None, :]).astype(jnp.float32)
    return -jnp.asarray(s, jnp.float32)[None, :, None, None] * dist[:, None]


class RelativePositionBias(nn.Module):
    """T5 bucketed relative position bias, one scalar per (bucket, head), shared by all layers."""

    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool

    def bucket(self, rel, bidirectional=None):  # rel = key_pos - query_pos
        n = self.num_buckets
        ret = 0
        if self.bidirectional if bidirectional is None else bidirectional:
            n //= 2
            ret = (rel > 0).astype(jnp.int32) * n
            rel = jnp.abs(rel)
        else:
            rel = jnp.maximum(-rel, 0)
        max_exact = n // 2
        is_small = rel < max_exact
        large = max_exact + (
            jnp.log(rel.astype(jnp.float32) / max_exact + np.finfo(np.float32).eps)
            / math.log(self.max_distance / max_exact) * (n - max_exact)).astype(jnp.int32)
        large = jnp.minimum(large, n - 1)
        return ret + jnp.where(is_small, rel, large)

    @nn.compact
    def __call__(self, q_pos_BQ, k_pos_BS, bidirectional=None):
        """``bidirectional`` overrides the attribute (a shared encoder-decoder's encoder reads
        its decoder's table with bidirectional buckets)."""
        table_HN = self.param("rel_embedding", nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
            ("heads", "relpos_buckets")), (self.num_heads, self.num_buckets), jnp.float32)
        buckets_BQS = self.bucket(k_pos_BS[:, None, :] - q_pos_BQ[:, :, None], bidirectional)
        return jnp.transpose(table_HN[:, buckets_BQS], (1, 0, 2, 3))  # [B, H, Q, S]


def add_position_bias(mask_B1TS, pos_XHTS):
    """mask [B, 1, T, S] + position bias [1 or B, H, T, S] -> [B, H, T, S].

    Autodiff would sum the position bias gradient over the batch with a reduce, which XLA:CPU
    (YNN) runs ~70x slower than the same sum written as a matmul with a ones vector; the
    gradient here is that matmul (on CPU only: elsewhere autodiff's reduce is the right form).
    Same numbers (float32 sums in another order)."""
    if not cpu_gradients():
        return mask_B1TS + pos_XHTS
    return _add_bias(mask_B1TS.shape[1] == 1, pos_XHTS.shape[0] == 1, mask_B1TS, pos_XHTS)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _add_bias(mask_bcast, pos_bcast, mask_B1TS, pos_XHTS):
    return mask_B1TS + pos_XHTS


def _add_bias_fwd(mask_bcast, pos_bcast, mask_B1TS, pos_XHTS):
    return mask_B1TS + pos_XHTS, None


def _sum_over(g_BHTS, axis: int):
    ones = jnp.ones((g_BHTS.shape[axis],), g_BHTS.dtype)
    spec = "bhts,b->hts" if axis == 0 else "bhts,h->bts"
    return jnp.expand_dims(jnp.einsum(spec, g_BHTS, ones), axis)


def _add_bias_bwd(mask_bcast, pos_bcast, _, g_BHTS):
    return (_sum_over(g_BHTS, 1) if mask_bcast else g_BHTS,
            _sum_over(g_BHTS, 0) if pos_bcast else g_BHTS)


_add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


# ----------------------------------------------------------------------------- attention


def softmax_to(logits, dtype):
    """softmax(logits) over the last axis in float32, returned in ``dtype``.

    When ``dtype`` is narrower than float32 (bf16 compute), the backward pass keeps only these
    ``dtype`` probabilities (which the value product needs anyway) instead of autodiff's float32
    ones: softmax' = y (g - sum(g y)) evaluated in float32 from the rounded y. The float32
    probabilities are the largest activation of an attention layer (B H T S x 4 bytes: at
    T5 base with 16 sequences of 512 per chip, 192 MiB per encoder layer, 2.25 GiB across
    12 layers); t5x computes the whole softmax in bf16 instead (float32_attention_logits off).
    """
    dtype = jnp.dtype(dtype)
    if dtype.itemsize >= 4:
        return jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(dtype)
    return _softmax_narrow(logits.astype(jnp.float32), dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _softmax_narrow(logits32, dtype):
    return jax.nn.softmax(logits32, axis=-1).astype(dtype)


def _softmax_narrow_fwd(logits32, dtype):
    y = _softmax_narrow(logits32, dtype)
    # The residual is the returned array itself: the value product's backward needs the same
    # probabilities, and in a scanned stack two distinct arrays (as a barrier's output here
    # would be) become two stacked [layers, B, H, T, S] residuals.
    return y, y


def _softmax_narrow_bwd(dtype, y, g):
    # The barrier makes the backward read the stored probabilities. Without it XLA (TPU)
    # fuses the recomputation of y = exp / sum into the backward's fusion and keeps the float32
    # exp [B, H, T, S] alive across the whole forward pass to feed it: 192 MiB per T5-base
    # encoder layer at 16 x 512 tokens per chip (bench/RESULTS.md). Here, not in the forward
    # rule, so the forward's value product can still fuse the normalisation under remat.
    y = jax.lax.optimization_barrier(y)
    y32, g32 = y.astype(jnp.float32), g.astype(jnp.float32)
    return (y32 * (g32 - jnp.sum(g32 * y32, axis=-1, keepdims=True)),)


_softmax_narrow.defvjp(_softmax_narrow_fwd, _softmax_narrow_bwd)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention; masks and position biases arrive as one additive bias.

    decode=True appends this call's T keys/values at ``cache_index`` in the "cache" collection
    and attends over the whole cache (the bias then has the cache length as its key axis).
    Subclasses adapt it through ``dense_kwargs`` / ``adapt_kv`` / ``extend_kv`` (identity here).
    """

    cfg: object
    cross: bool = False  # cross-attention (keys / values from another sequence)

    def dense_kwargs(self, name: str) -> dict:
        """Extra DenseGeneral fields for the projection ``name`` (query, key, value, out)."""
        return {}

    def adapt_kv(self, k_BSHK, v_BSHK):
        """Keys / values right after their projections."""
        return k_BSHK, v_BSHK

    def extend_kv(self, k_BSHK, v_BSHK, bias_BHTS):
        """Keys / values (and the bias over them) after the KV cache, before attending."""
        return k_BSHK, v_BSHK, bias_BHTS

    @nn.compact
    def __call__(self, x_BTD, kv_BSD, bias_BHTS, rope_pos_BT=None, deterministic=True,
                 decode=False, cache_index=None):
        cfg = self.cfg
        dtype = compute_dtype(cfg)
        h, k = cfg.num_heads, cfg.head_dim
        t5_query_scale = 1.0 if (cfg.scale_attn_logits or cfg.init_std > 0) else k ** -0.5
        proj = functools.partial(DenseGeneral, features=(h, k),
                                 kernel_axes=("embed", "heads", "kv"), use_bias=cfg.use_bias,
                                 dtype=dtype, init=kernel_init(cfg),
                                 flat_kernel=cfg.flat_kernels)
        q_BTHK = proj(name="query", init=kernel_init(cfg, t5_query_scale),
                      **self.dense_kwargs("query"))(x_BTD)
        k_BSHK = proj(name="key", **self.dense_kwargs("key"))(kv_BSD)
        v_BSHK = proj(name="value", **self.dense_kwargs("value"))(kv_BSD)
        q_BTHK, k_BSHK, v_BSHK = (checkpoint_name(a, n) for a, n in zip(
            (q_BTHK, k_BSHK, v_BSHK), ("query_proj", "key_proj", "value_proj")))
        k_BSHK, v_BSHK = self.adapt_kv(k_BSHK, v_BSHK)
        if rope_pos_BT is not None:  # self-attention with RoPE: keys share the query positions
            q_BTHK = apply_rope(q_BTHK, rope_pos_BT, cfg.rope_max_wavelength)
            k_BSHK = apply_rope(k_BSHK, rope_pos_BT, cfg.rope_max_wavelength)
        if decode:
            k_BSHK, v_BSHK = self._update_cache(k_BSHK, v_BSHK, cache_index)
        k_BSHK, v_BSHK, bias_BHTS = self.extend_kv(k_BSHK, v_BSHK, bias_BHTS)
        axes = ("batch", "length", "heads", "kv")
        q_BTHK, k_BSHK, v_BSHK = (constrain(a, axes) for a in (q_BTHK, k_BSHK, v_BSHK))
        if cfg.scale_attn_logits:
            q_BTHK = q_BTHK * jnp.asarray(k ** -0.5, dtype)
        logits_BHTS = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BSHK).astype(jnp.float32)
        weights_BHTS = softmax_to(logits_BHTS + bias_BHTS, dtype)
        weights_BHTS = nn.Dropout(cfg.dropout_rate)(weights_BHTS, deterministic=deterministic)
        out_BTHK = jnp.einsum("bhts,bshk->bthk", weights_BHTS, v_BSHK)
        out_BTD = DenseGeneral(features=(cfg.d_model,), kernel_axes=("heads", "kv", "embed"),
                               n_in=2, use_bias=cfg.use_bias, dtype=dtype,
                               init=kernel_init(cfg), name="out", flat_kernel=cfg.flat_kernels,
                               **self.dense_kwargs("out"))(out_BTHK)
        out_BTD = checkpoint_name(out_BTD, "out_proj")
        return constrain(out_BTD, ("batch", "length", "embed"))

    def _update_cache(self, k_BTHK, v_BTHK, index):
        """Write T new keys/values at ``index``; return the full cached keys/values."""
        initialized = self.has_variable("cache", "cached_key")
        ck = self.variable("cache", "cached_key", jnp.zeros, k_BTHK.shape, k_BTHK.dtype)
        cv = self.variable("cache", "cached_value", jnp.zeros, v_BTHK.shape, v_BTHK.dtype)
        if not initialized:  # init_cache: shapes only, cache stays empty
            return k_BTHK, v_BTHK
        start = (0, index, 0, 0)
        ck.value = jax.lax.dynamic_update_slice(ck.value, k_BTHK.astype(ck.value.dtype), start)
        cv.value = jax.lax.dynamic_update_slice(cv.value, v_BTHK.astype(cv.value.dtype), start)
        return ck.value, cv.value


# ----------------------------------------------------------------------------- MLP

ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "silu": nn.silu,
    # gated (GLU family, Shazeer 2020): act(x W0) * (x W1). geglu uses tanh-gelu as T5 v1.1.
    "glu": nn.sigmoid,
    "geglu": functools.partial(nn.gelu, approximate=True),
    "reglu": nn.relu,
    "swiglu": nn.silu,
    "bilinear": lambda x: x,
}
GATED = ("glu", "geglu", "reglu", "swiglu", "bilinear")


class MLP(nn.Module):
    """Feed-forward block: wi -> act -> dropout -> wo, or gated wi_0 / wi_1 for GLU variants.
    Subclasses adapt it through ``dense_kwargs`` / ``adapt_hidden`` (identity here)."""

    cfg: object

    def dense_kwargs(self, name: str) -> dict:
        """Extra DenseGeneral fields for the projection ``name`` (wi, wi_0, wi_1, wo)."""
        return {}

    def adapt_hidden(self, h_BLF):
        """The hidden activations after the nonlinearity."""
        return h_BLF

    @nn.compact
    def __call__(self, x_BLD, deterministic=True):
        cfg = self.cfg
        dtype = compute_dtype(cfg)
        act = ACTIVATIONS[cfg.ffn]
        dense = functools.partial(DenseGeneral, features=(cfg.d_ff,), kernel_axes=("embed", "mlp"),
                                  use_bias=cfg.use_bias, dtype=dtype, init=kernel_init(cfg))
        kw = self.dense_kwargs
        if cfg.ffn in GATED:
            h_BLF = recompute_in_backward(lambda a, b: act(a) * b)(
                checkpoint_name(dense(name="wi_0", **kw("wi_0"))(x_BLD), "mlpwi_0"),
                checkpoint_name(dense(name="wi_1", **kw("wi_1"))(x_BLD), "mlpwi_1"))
        else:
            h_BLF = recompute_in_backward(act)(
                checkpoint_name(dense(name="wi", **kw("wi"))(x_BLD), "mlpwi"))
        h_BLF = self.adapt_hidden(h_BLF)
        h_BLF = constrain(h_BLF, ("batch", "length", "mlp"))
        h_BLF = nn.Dropout(cfg.dropout_rate)(h_BLF, deterministic=deterministic)
        out_BLD = DenseGeneral(features=(cfg.d_model,), kernel_axes=("mlp", "embed"),
                               use_bias=cfg.use_bias, dtype=dtype, init=kernel_init(cfg),
                               name="wo", **kw("wo"))(h_BLF)
        out_BLD = checkpoint_name(out_BLD, "mlpwo")
        return constrain(out_BLD, ("batch", "length", "embed"))


# ----------------------------------------------------------------------------- masks


def attention_bias(mask_BQS) -> jnp.ndarray:
    """Boolean mask [B, Q, S] -> additive float32 bias [B, 1, Q, S]."""
    return jnp.where(mask_BQS, 0.0, NEG_INF).astype(jnp.float32)[:, None]


def self_attention_mask(valid_BL, segments_BL=None, causal=False, prefix_BL=None):
    """Which keys each query may see: same segment, valid key, and causal / prefix-LM rules."""
    mask = valid_BL[:, None, :] & valid_BL[:, :, None]
    if segments_BL is not None:
        mask &= segments_BL[:, :, None] == segments_BL[:, None, :]
    if causal:
        n = valid_BL.shape[1]
        allowed = jnp.tril(jnp.ones((n, n), bool))[None]
        if prefix_BL is not None:  # bidirectional inside the prefix
            p = prefix_BL.astype(bool)
            allowed = allowed | (p[:, :, None] & p[:, None, :])
        mask &= allowed
    return mask


def cross_attention_mask(q_valid_BT, k_valid_BS, q_segments_BT=None, k_segments_BS=None):
    mask = q_valid_BT[:, :, None] & k_valid_BS[:, None, :]
    if q_segments_BT is not None and k_segments_BS is not None:
        mask &= q_segments_BT[:, :, None] == k_segments_BS[:, None, :]
    return mask


def maybe(x: Optional[jnp.ndarray], default):
    return default if x is None else x
