"""Building blocks: dense / embedding with logical axes, norms, attention, MLP, masks.

Shapes: B batch, L / T query length, S key length, D embed, H heads, K head dim, F mlp, V vocab.
Every parameter is boxed with its logical axis names (nn.with_logical_partitioning); large
activations are constrained with nn.with_logical_constraint. Params are float32; computation
runs in ``dtype`` (softmax and norms in float32). Modules that own a backend-specific gradient
(gradient_rules.py) take the model's ``gradient_rules`` choice as a field.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from t5lite.models import fixup
from t5lite.models.gradient_rules import dot, recompute_in_backward, uses_cpu_rules
from t5lite.models.positions import apply_rope
from t5lite.models.registry import AttentionBackend, FFNLayer, TokenMixer

NEG_INF = -1e10  # additive mask value (finite: fully masked rows stay NaN-free)

Axes = tuple[str, ...]


def compute_dtype(cfg) -> jnp.dtype:
    return jnp.dtype(cfg.dtype)


def constrain(x, axes: Axes):
    return nn.with_logical_constraint(x, axes)


# the std of a unit normal truncated to [-2, 2]: Flax divides a truncated normal's std by it,
# TF's truncated_normal_initializer (Mesh TF's dense kernels) does not
TRUNCATED_STD = 0.87962566103423978


def kernel_init(cfg, scale: float = 1.0) -> Callable:
    """A dense kernel's init, variance ``scale`` / fan_in: T5X's truncated normal (its std
    corrected for the truncation); with model.initializers="mesh_tf" Mesh TF's uncorrected one,
    TF's truncated_normal(stddev=sqrt(scale / fan_in)) (mesh_tensorflow/layers.py
    VarianceScalingInitializer.__call__, :342-362 at da907937): 0.88 times the spread.
    BERT/GPT-2: N(0, init_std)."""
    if cfg.init_std > 0:
        return nn.initializers.normal(cfg.init_std)
    if cfg.initializers == "mesh_tf":
        scale = scale * TRUNCATED_STD ** 2
    return nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")


def attention_init(cfg, scale: float = 1.0) -> Callable:
    """An attention projection's init: kernel_init's, or with model.initializers="mesh_tf"
    Mesh TF's AttentionParams: an untruncated normal of variance ``scale`` / fan_in
    (mesh_tensorflow/transformer/attention.py init_weights, :428-443 at da907937)."""
    if cfg.init_std == 0 and cfg.initializers == "mesh_tf":
        return nn.initializers.variance_scaling(scale, "fan_in", "normal")
    return kernel_init(cfg, scale)


def dropout(cfg, length_axis: int = -2) -> nn.Dropout:
    """Dropout at model.dropout_rate; with model.dropout_broadcast="length" one mask per example
    and feature, shared along ``length_axis`` (Mesh TF: transformer.py sublayer_dropout, :589-595,
    noise_shape batch + d_model; transformer_layers.py DenseReluDense, :66-69, and the
    attention weights, attention.py :1648, noise_shape without the length dim; t5x's T5:
    broadcast_dims=(-2,))."""
    dims = (length_axis,) if cfg.dropout_broadcast == "length" else ()
    return nn.Dropout(cfg.dropout_rate, broadcast_dims=dims)


def embed_init(cfg) -> Callable:
    return nn.initializers.normal(cfg.init_std if cfg.init_std > 0 else 1.0)


class DenseGeneral(nn.Module):
    """y = x . W (+ b) contracting the trailing ``n_in`` dims of x into ``features``.

    The kernel is initialised as a 2-D (fan_in, fan_out) matrix, so fan-in is the product of
    the contracted dims (as in T5X), and with ``flat_kernel`` (model.flat_kernels) also stored
    so (multiplied as stored or as an [in..., out...] view: ``_matmul``); its two logical
    axes are the first named axis of each group (the major one: sharding it shards the joined
    dim the same way).
    Without it the param has the [in..., out...] shape. Subclasses add to the output through
    ``output_update`` (none here; t5lite.peft.LoraDense: a low-rank update).
    """

    features: Sequence[int]
    kernel_axes: Axes  # logical names of the kernel: contracted dims then feature dims
    n_in: int = 1  # how many trailing input dims are contracted
    use_bias: bool = False
    dtype: jnp.dtype = jnp.float32
    init: Callable = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
    flat_kernel: bool = True
    gradient_rules: str = "auto"  # model.gradient_rules

    @nn.compact
    def __call__(self, x):
        features = tuple(self.features)
        in_shape = x.shape[-self.n_in:]
        shape = in_shape + features
        flat = (int(np.prod(in_shape)), int(np.prod(features)))

        def init_fn(key, shape, dtype=jnp.float32):
            return self.init(key, flat, dtype).reshape(shape)

        (in_dims, in_axes), (out_dims, out_axes) = self.stored_layout(in_shape, features)
        kernel = self.param("kernel", nn.with_logical_partitioning(init_fn, in_axes + out_axes),
                            in_dims + out_dims, jnp.float32)
        x = x.astype(self.dtype)
        y = self._matmul(x, kernel.astype(self.dtype), in_shape, features)
        if self.use_bias:
            bias = self.param("bias", nn.with_logical_partitioning(
                nn.initializers.zeros, self.kernel_axes[self.n_in:]), features, jnp.float32)
            y = y + bias.astype(self.dtype)
        update = self.output_update(x, in_shape, features)
        return y if update is None else y + update

    def _matmul(self, x, stored, in_shape, features):
        """x . kernel. On the accelerator rules a flat kernel multiplies as stored, one
        [in, out] matmul (x and y reshaped), so its gradient is 2-D: libtpu gave the gradient
        of a [D, H, K] view a layout with D minor and all-reduced it whole where fsdp shards
        D; a 2-D one gets D major, as the MLP's, and is reduce-scattered. The CPU rules keep
        the view: XLA:CPU sums the flat matmul in another order, which would move the
        recorded bit-identical model digests."""
        if (not self.flat_kernel or (len(in_shape), len(features)) == (1, 1)
                or uses_cpu_rules(self.gradient_rules)):
            return dot(x, stored.reshape(in_shape + features), self.n_in,
                       rules=self.gradient_rules)
        lead = x.shape[:x.ndim - self.n_in]
        y = dot(x.reshape(lead + stored.shape[:1]), stored, 1, rules=self.gradient_rules)
        return y.reshape(lead + features)

    def output_update(self, x, in_shape, features):
        """A term added to the output, from the input ``x`` (in ``dtype``); None here."""
        return None

    def stored_layout(self, in_shape, features):
        """How the params store the contracted and the feature dims: ((dims, logical axes) of
        the input side, (dims, axes) of the output side); with flat_kernel each side is one
        dim named by its first named axis (the major one)."""
        axes = tuple(self.kernel_axes)
        sides = ((tuple(in_shape), axes[:self.n_in]), (tuple(features), axes[self.n_in:]))
        if not self.flat_kernel:
            return sides
        return tuple(((int(np.prod(dims)),), (next((a for a in names if a is not None), None),))
                     for dims, names in sides)


class Embed(nn.Module):
    """Lookup table [num, D]; ``attend`` gives the tied output projection x . E^T."""

    num_embeddings: int
    features: int
    axes: Axes = ("vocab", "embed")
    dtype: jnp.dtype = jnp.float32
    init: Callable = nn.initializers.normal(1.0)
    gradient_rules: str = "auto"  # model.gradient_rules

    def setup(self):
        self.embedding = self.param(
            "embedding", nn.with_logical_partitioning(self.init, self.axes),
            (self.num_embeddings, self.features), jnp.float32)

    def __call__(self, ids):
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x):
        return dot(x.astype(self.dtype), self.embedding.astype(self.dtype), 1, True,
                   rules=self.gradient_rules)


class Norm(nn.Module):
    """RMSNorm (T5: scale only, no mean subtraction) or LayerNorm (scale and bias)."""

    kind: str = "rmsnorm"
    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    gradient_rules: str = "auto"  # model.gradient_rules

    @nn.compact
    def __call__(self, x):
        if self.kind == "none":  # model.norm="none" (ReZero, Fixup): no norm, no params
            return x.astype(self.dtype)
        d = x.shape[-1]
        scale = self.param("scale", nn.with_logical_partitioning(
            nn.initializers.ones, ("embed",)), (d,), jnp.float32)
        bias = None
        if self.kind == "layernorm":
            bias = self.param("bias", nn.with_logical_partitioning(
                nn.initializers.zeros, ("embed",)), (d,), jnp.float32)
        return recompute_in_backward(self._normalize, self.gradient_rules)(x, scale, bias)

    def _normalize(self, x, scale, bias):
        x32 = x.astype(jnp.float32)
        if self.kind == "layernorm":
            x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        y = y * scale
        if bias is not None:
            y = y + bias
        return y.astype(self.dtype)


def make_norm(cfg, name: Optional[str] = None) -> Norm:
    """The model's norm (cfg: a ModelConfig)."""
    return Norm(kind=cfg.norm, eps=cfg.norm_eps, dtype=compute_dtype(cfg),
                gradient_rules=cfg.gradient_rules, name=name)


def make_embed(cfg, num_embeddings: int, features: int, axes: Axes,
               init: Optional[Callable] = None) -> Embed:
    """An embedding table with the model's dtype, init (unless ``init``) and gradient rules."""
    return Embed(num_embeddings, features, axes, compute_dtype(cfg), init or embed_init(cfg),
                 cfg.gradient_rules)


def make_dense(cfg, features: int, axes: Axes, use_bias: bool, name: Optional[str] = None,
               **fields) -> DenseGeneral:
    """A one-axis dense layer with the model's dtype, init and gradient rules."""
    return DenseGeneral((features,), axes, use_bias=use_bias, dtype=compute_dtype(cfg),
                        init=fields.pop("init", kernel_init(cfg)),
                        gradient_rules=cfg.gradient_rules, name=name, **fields)


# ----------------------------------------------------------------------------- attention


def softmax_to(logits, dtype):
    """softmax(logits) over the last axis in float32, returned in ``dtype``.

    When ``dtype`` is narrower than float32 (bf16 compute), the backward pass keeps only these
    ``dtype`` probabilities (which the value product needs anyway) instead of autodiff's float32
    ones: softmax' = y (g - sum(g y)) evaluated in float32 from the rounded y, and returned
    rounded to ``dtype`` (what the logits' ``dtype`` einsum reads). The float32 probabilities
    are the largest activation of an attention layer (B H T S x 4 bytes, per layer); t5x
    computes the whole softmax in bf16 instead (float32_attention_logits off).
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
    # exp [B, H, T, S] alive across the whole forward pass to feed it (bench/RESULTS.md).
    # Here, not in the forward rule, so the forward's value product can still fuse the
    # normalisation under remat.
    y = jax.lax.optimization_barrier(y)
    y32, g32 = y.astype(jnp.float32), g.astype(jnp.float32)
    dx32 = y32 * (g32 - jnp.sum(g32 * y32, axis=-1, keepdims=True))
    # The logits gradient leaves in ``dtype``, stored once: the query / key gradients read it
    # in ``dtype`` anyway (the logits came from a ``dtype`` einsum), and the position-bias
    # gradient (a sum over the batch, which XLA schedules at the end of the backward pass, off
    # the critical path) then holds this one narrow array per layer until it runs, not the
    # probabilities and their gradient that a fused dx would be recomputed from, nor a float32
    # dx. The same bytes as t5x's bf16 softmax gradient; the bias sums stay float32.
    dx = jax.lax.optimization_barrier(dx32.astype(dtype))
    return (dx.astype(jnp.float32),)


_softmax_narrow.defvjp(_softmax_narrow_fwd, _softmax_narrow_bwd)


def query_init_scale(cfg) -> float:
    """The query kernel's init variance scale: 1, or where T5 folds the logits' 1 / sqrt(head
    dim) into that init, 1 / head_dim (the std over sqrt(head_dim)), as both references do:
    t5x's MultiHeadDotProductAttention (t5x/examples/t5/layers.py, ``query_init =
    kernel_init / depth_scaling``, depth_scaling = sqrt(head_dim)) and Mesh TF's
    (transformer/attention.py init_weights, :436-439)."""
    if cfg.scale_attn_logits or cfg.init_std > 0:
        return 1.0
    return 1.0 / cfg.head_dim


def xla_attend(module: nn.Module, q_BTHK, k_BSHK, v_BSHK, bias_BHTS, deterministic: bool):
    """softmax(q k^T + bias) v with the additive [B, 1 or H, T, S] bias, the weights dropped
    out at model.dropout_rate (a dropout submodule of the calling attention ``module``)."""
    dtype = compute_dtype(module.cfg)
    logits_BHTS = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BSHK).astype(jnp.float32)
    weights_BHTS = softmax_to(logits_BHTS + bias_BHTS, dtype)
    weights_BHTS = dropout(module.cfg)(weights_BHTS, deterministic=deterministic)
    return jnp.einsum("bhts,bshk->bthk", weights_BHTS, v_BSHK)


# model.attention_kernel="xla": the Stack builds the masks and position biases as arrays
XLA_ATTENTION = AttentionBackend("xla", xla_attend)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention; masks and position biases arrive as one additive bias, or as
    what ``backend`` (a registry.AttentionBackend the Stack chose) reads.

    decode=True appends this call's T keys/values at ``cache_index`` in the "cache" collection
    and attends over the whole cache (the bias then has the cache length as its key axis).
    Subclasses adapt it through ``dense_layer`` / ``adapt_kv`` / ``extend_kv`` /
    ``combine_heads`` (plain dense layers and identities here).
    """

    cfg: object
    cross: bool = False  # cross-attention (keys / values from another sequence)
    backend: AttentionBackend = XLA_ATTENTION

    def dense_layer(self, name: str, **fields) -> DenseGeneral:
        """The projection ``name`` (query, key, value, out) with these DenseGeneral fields."""
        return DenseGeneral(name=name, **fixup.dense_fields(self.cfg, name, fields, self.cross))

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
        shared = dict(use_bias=cfg.use_bias, dtype=dtype, init=attention_init(cfg),
                      flat_kernel=cfg.flat_kernels, gradient_rules=cfg.gradient_rules)
        projection = dict(shared, features=(h, k), kernel_axes=("embed", "heads", "kv"))
        q_BTHK = self.dense_layer("query", **dict(
            projection, init=attention_init(cfg, query_init_scale(cfg))))(x_BTD)
        k_BSHK = self.dense_layer("key", **projection)(kv_BSD)
        v_BSHK = self.dense_layer("value", **projection)(kv_BSD)
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
        out_BTHK = self.backend.attend(self, q_BTHK, k_BSHK, v_BSHK, bias_BHTS, deterministic)
        out_BTD = checkpoint_name(self.combine_heads(out_BTHK, shared, deterministic),
                                  "out_proj")
        return constrain(out_BTD, ("batch", "length", "embed"))

    def combine_heads(self, out_BTHK, shared: dict, deterministic: bool):
        """[B, T, H, K] -> [B, T, D]: the output projection "out" (``shared``: its DenseGeneral
        fields); models/weighted.py overrides it."""
        return self.dense_layer("out", features=(self.cfg.d_model,), n_in=2,
                                kernel_axes=("heads", "kv", "embed"), **shared)(out_BTHK)

    def _update_cache(self, k_BTHK, v_BTHK, index):
        """Write T new keys/values at ``index``; return the full cached keys/values."""
        initialized = self.has_variable("cache", "cached_key")
        keys = self.variable("cache", "cached_key", jnp.zeros, k_BTHK.shape, k_BTHK.dtype)
        values = self.variable("cache", "cached_value", jnp.zeros, v_BTHK.shape, v_BTHK.dtype)
        if not initialized:  # init_cache: shapes only, cache stays empty
            return k_BTHK, v_BTHK
        start = (0, index, 0, 0)
        keys.value = jax.lax.dynamic_update_slice(
            keys.value, k_BTHK.astype(keys.value.dtype), start)
        values.value = jax.lax.dynamic_update_slice(
            values.value, v_BTHK.astype(values.value.dtype), start)
        return keys.value, values.value


# model.attention_type="multihead": the Stack's attention class (PEFT's when it adapts it) on
# the backend of the call
MULTIHEAD = TokenMixer(("multihead",), lambda attention_cls, causal, backend: functools.partial(
    attention_cls, backend=backend))


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
    # Narang et al. 2021's other activations
    "elu": nn.elu,
    "selu": nn.selu,
    "sigmoid": nn.sigmoid,
    "softplus": nn.softplus,
}
GATED = ("glu", "geglu", "reglu", "swiglu", "bilinear")
# model.ffn_layer="dense": the Stack's MLP class (PEFT's when it adapts it)
DENSE_FFN = FFNLayer("dense")


class MLP(nn.Module):
    """Feed-forward block: wi -> act -> dropout -> wo, or gated wi_0 / wi_1 for GLU variants.
    Subclasses adapt it through ``dense_layer`` / ``adapt_hidden`` (a plain dense layer and
    the identity here)."""

    cfg: object

    def dense_layer(self, name: str, **fields) -> DenseGeneral:
        """The projection ``name`` (wi, wi_0, wi_1, wo) with these DenseGeneral fields."""
        return DenseGeneral(name=name, **fixup.dense_fields(self.cfg, name, fields))

    def adapt_hidden(self, h_BLF):
        """The hidden activations after the nonlinearity."""
        return h_BLF

    @nn.compact
    def __call__(self, x_BLD, deterministic=True):
        cfg = self.cfg
        dtype = compute_dtype(cfg)
        act = ACTIVATIONS[cfg.ffn]
        rules = cfg.gradient_rules
        shared = dict(use_bias=cfg.use_bias or cfg.ffn_bias, dtype=dtype,
                      init=kernel_init(cfg, cfg.ffn_init_scale), gradient_rules=rules)

        def wi(name):
            dense = self.dense_layer(name, features=(cfg.d_ff,), kernel_axes=("embed", "mlp"),
                                     **shared)
            return checkpoint_name(dense(x_BLD), "mlp" + name)

        if cfg.ffn in GATED:
            h_BLF = recompute_in_backward(lambda a, b: act(a) * b, rules)(wi("wi_0"), wi("wi_1"))
        else:
            h_BLF = recompute_in_backward(act, rules)(wi("wi"))
        h_BLF = self.adapt_hidden(h_BLF)
        h_BLF = constrain(h_BLF, ("batch", "length", "mlp"))
        h_BLF = dropout(cfg)(h_BLF, deterministic=deterministic)
        out_BLD = self.dense_layer("wo", features=(cfg.d_model,), kernel_axes=("mlp", "embed"),
                                   **shared)(h_BLF)
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

