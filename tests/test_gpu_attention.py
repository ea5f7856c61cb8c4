"""The GPU attention kernels (models/gpu_attention.py, gpu_flash_kernels.py) against the model's
XLA attention on CPU: "flash_gpu" (the Pallas Triton kernel, in interpret mode here) on one
layer's output and every gradient (projections, both inputs, the relative bias table) on
packed and padded rows, encoder, causal decoder, cross-attention and ALiBi; "cudnn"'s wrapper
(masks, sequence lengths, causal, the [1, H, T, S] bias and its gradient) through
jax.nn.dot_product_attention with implementation="xla", since cuDNN needs a GPU; whole models
with each kernel against "xla"; the Triton kernels lowered for CUDA from this CPU host (the
Triton IR is built here: an op Triton lacks fails here); "auto" per backend and the refusals.

Interpret mode runs every grid program: sizes are tiny, blocks small (16 / 32 slots), but
each attention spans several query and key blocks. Rows with no visible key (padding queries)
are left out: both paths leave them unspecified.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.config import ModelConfig, presets
from t5lite.errors import UserError
from t5lite.models import build_model
from t5lite.models import gpu_attention as GA
from t5lite.models import layers as L
from t5lite.models.plan import ATTENTION_BACKENDS
from t5lite.models.positions import RelativePositionBias, alibi_bias
from t5lite.train import losses
from test_flash_attention import KV_SEG, Q_SEG, _packed_batch, _segments, _xla_bias

KEY = functools.partial(jax.random.key, impl="rbg")
BLOCKS = dict(block_q=32, block_k=16)


def _cudnn_bias(cfg, q_seg, kv_seg, kind, causal, table, packed):
    """The cudnn wrapper's object for one layer: the XLA path's position bias and a segment
    mask (packed) or sequence lengths (rows right-padded)."""
    pos = _position_bias(cfg, q_seg.shape[1], kv_seg.shape[1], kind, causal, table)
    fields = dict(causal=causal, implementation="xla")
    if packed:
        cross = q_seg is not kv_seg
        mask = (L.cross_attention_mask(q_seg != 0, kv_seg != 0, q_seg, kv_seg) if cross
                else L.self_attention_mask(q_seg != 0, q_seg))
        return GA.CudnnBias(pos, mask[:, None], **fields)
    return GA.CudnnBias(pos, None, jnp.sum(q_seg != 0, 1, dtype=jnp.int32),
                        jnp.sum(kv_seg != 0, 1, dtype=jnp.int32), **fields)


def _position_bias(cfg, t, s, kind, causal, table):
    """The model's [1, H, T, S] position bias over slots (positions.py), or None."""
    pos_q, pos_k = jnp.arange(t)[None], jnp.arange(s)[None]
    if kind == "relative":
        module = RelativePositionBias(table.shape[1], cfg.relative_max_distance, cfg.num_heads,
                                      not causal)
        return module.apply({"params": {"rel_embedding": table}}, pos_q, pos_k)
    return alibi_bias(pos_q, pos_k, cfg.num_heads) if kind == "alibi" else None


def _run(cfg, kind, causal, cross, how, packed=True):
    """Output at real queries and the gradients of loss(params, x, kv, table) of one
    MultiHeadAttention with the registered backend ``how``: xla (the model's bias),
    flash_gpu or cudnn (the wrapper)."""
    q_seg, kv_seg = (Q_SEG, KV_SEG) if packed else (_segments([(150,), (90,), (31,)], 150),
                                                   _segments([(100,), (70,), (9,)], 100))
    q_seg = q_seg if cross else q_seg[:, :100] if causal else kv_seg
    kv_seg = kv_seg if cross else q_seg
    b, t, s = q_seg.shape[0], q_seg.shape[1], kv_seg.shape[1]
    module = L.MultiHeadAttention(cfg, cross=cross, backend=ATTENTION_BACKENDS[how])
    x = jax.random.normal(KEY(1), (b, t, cfg.d_model)).astype(cfg.dtype)
    kv = jax.random.normal(KEY(2), (b, s, cfg.d_model)).astype(cfg.dtype)
    table = jax.random.normal(KEY(3), (cfg.num_heads, cfg.relative_buckets))
    params = L.MultiHeadAttention(cfg, cross=cross).init(
        KEY(0), x, kv, jnp.zeros((1, 1, t, s)))["params"]
    weight = jax.random.normal(KEY(4), (b, t, cfg.d_model)) * (q_seg != 0)[..., None]

    def loss(params, x, kv, table):
        if how == "flash_gpu":
            bias = GA.FlashGpuBias(q_seg, kv_seg, table if kind == "relative" else None, kind,
                                   causal, not causal, cfg.relative_max_distance, **BLOCKS)
        elif how == "cudnn":
            bias = _cudnn_bias(cfg, q_seg, kv_seg, kind, causal, table, packed)
        else:
            bias = _xla_bias(cfg, q_seg, kv_seg, kind, causal, table)
        out = module.apply({"params": params}, x, kv if cross else x, bias)
        return jnp.sum(out.astype(jnp.float32) * weight), out

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
    (_, out), grads = grad(params, x, kv, table)
    valid = np.asarray(q_seg != 0)
    return np.asarray(out, np.float32)[valid], jax.tree.map(
        lambda a: np.asarray(a, np.float32), grads)


def _config(dtype="float32", **kw):
    return ModelConfig(d_model=32, num_heads=2, head_dim=16, relative_buckets=32,
                       relative_max_distance=24, dtype=dtype, dropout_rate=0.0, **kw)


def _assert_close(got, want, rtol):
    (out_g, grads_g), (out_w, grads_w) = got, want
    np.testing.assert_allclose(out_g, out_w, atol=rtol * np.max(np.abs(out_w)), rtol=0)
    leaves_w = jax.tree.leaves(grads_w)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(grads_g), leaves_w):
        np.testing.assert_allclose(g, w, atol=rtol * max(np.max(np.abs(w)), 1e-6), rtol=0,
                                   err_msg=jax.tree_util.keystr(path))


# (bias kind, causal, cross): encoder self-attention (bidirectional buckets), decoder causal
# self-attention (unidirectional buckets), cross-attention (no bias), ALiBi causal
CASES = {"encoder": ("relative", False, False), "decoder": ("relative", True, False),
         "cross": ("none", False, True), "alibi_causal": ("alibi", True, False)}


@pytest.mark.parametrize("case", list(CASES))
def test_flash_gpu_kernel_equals_model_attention(case):
    """Forward and the gradients of the projections, both inputs and the bias table agree
    with the XLA attention to float32 rounding (1e-5 of each array's largest entry)."""
    kind, causal, cross = CASES[case]
    cfg = _config()
    _assert_close(_run(cfg, kind, causal, cross, "flash_gpu"),
                  _run(cfg, kind, causal, cross, "xla"), 1e-5)


def test_flash_gpu_kernel_bfloat16():
    """bfloat16 compute: the kernel keeps logits and probabilities in float32 where the XLA
    path rounds them to bfloat16: agreement to bfloat16 rounding (2e-2 of each array's
    largest entry, as the TPU kernel's test)."""
    cfg = _config("bfloat16")
    _assert_close(_run(cfg, "relative", False, False, "flash_gpu"),
                  _run(cfg, "relative", False, False, "xla"), 2e-2)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("packed", [True, False], ids=["mask", "lengths"])
def test_cudnn_wrapper_equals_model_attention(case, packed):
    """The cudnn wrapper (bias, boolean mask or sequence lengths, causal flag) through
    jax.nn.dot_product_attention's XLA implementation: the model's attention, output and
    every gradient, the bias table's included (float32 rounding)."""
    kind, causal, cross = CASES[case]
    cfg = _config()
    _assert_close(_run(cfg, kind, causal, cross, "cudnn", packed),
                  _run(cfg, kind, causal, cross, "xla", packed), 1e-5)


# ----------------------------------------------------------------------------- whole models
# Models built from the config (model.attention_kernel) with each kernel, against "xla".
# On this CPU host "cudnn" runs its wrapper through XLA's implementation of the same call and
# "flash_gpu" its Triton kernels interpreted: both refused here unless a test says so.


def _model_grads(cfg, batch):
    """(loss, logits at scored positions, every parameter's gradient) of one model."""
    model = build_model(cfg)
    params = nn.meta.unbox(model.init(KEY(0), batch)["params"])
    targets = batch.get("decoder_target_tokens", batch.get("encoder_target_tokens"))
    weights = batch.get("decoder_loss_weights", batch.get("encoder_loss_weights"))

    def loss(params):
        logits = model.apply({"params": params}, batch)["logits"]
        xent, _ = losses.cross_entropy_with_logits(logits, targets)
        return jnp.sum(xent * weights), logits

    (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return value, np.asarray(logits)[np.asarray(weights) > 0], grads


def _assert_models_agree(base, kernel, batch):
    (loss_x, logits_x, grads_x), (loss_k, logits_k, grads_k) = (
        _model_grads(dataclasses.replace(base, attention_kernel=k), batch)
        for k in ("xla", kernel))
    np.testing.assert_allclose(loss_k, loss_x, rtol=1e-5)
    np.testing.assert_allclose(logits_k, logits_x, atol=1e-4)
    assert jax.tree.structure(grads_k) == jax.tree.structure(grads_x)
    for (path, gk), gx in zip(jax.tree_util.tree_leaves_with_path(grads_k),
                              jax.tree.leaves(grads_x)):
        np.testing.assert_allclose(gk, gx, atol=1e-5 * max(np.max(np.abs(gx)), 1e-3),
                                   err_msg=jax.tree_util.keystr(path))


T5 = ModelConfig(vocab_size=64, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                 num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0,
                 relative_max_distance=24)


def _small_packed_batch():
    """Two rows of packed encoder-decoder data, padding at the end: 48 / 24 slots, 3 / 2
    blocks of 16 (_packed_batch's 100 / 40 interpret several times longer)."""
    return _packed_batch(encoder=([(20, 18), (30,)], 48), decoder=([(10, 12), (16,)], 24))


def _unpacked(batch):
    """The packed batch's rows as unpacked, right-padded rows: no segment ids or positions
    (the encoder's padding from token 0)."""
    return {k: v for k, v in batch.items() if "segment" not in k and "position" not in k}


# (padded: the lengths path, also run per layer above; slow here, `pytest --runslow` runs it)
@pytest.mark.parametrize("packed", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["packed", "padded"])
def test_t5_with_cudnn_wrapper_equals_xla(monkeypatch, packed):
    """A tiny T5 (relative bias in both stacks, cross-attention, scanned layers) with
    model.attention_kernel="cudnn" through XLA's implementation of the same call: logits,
    loss and every parameter's gradient (the relative tables' included) equal the XLA
    attention's, with the segment mask (packed) and with sequence lengths (padded)."""
    monkeypatch.setattr(GA, "CUDNN_IMPLEMENTATION", "xla")
    batch = _small_packed_batch()
    _assert_models_agree(T5, "cudnn", batch if packed else _unpacked(batch))


def test_t5_with_flash_gpu_equals_xla(monkeypatch):
    """The same with model.attention_kernel="flash_gpu" (the Triton kernel interpreted):
    16-slot blocks, so every attention spans several query and key blocks."""
    monkeypatch.setattr(GA, "GPU_BLOCK", 16)
    monkeypatch.setattr(GA, "INTERPRET_OFF_GPU", True)
    _assert_models_agree(T5, "flash_gpu", _small_packed_batch())


# (GPT: slow here; fast, the same guard: test_gpu_attention_config's GPT with auto on a GPU
# runs cuDNN's wrapper and equals xla)
@pytest.mark.parametrize("family", [pytest.param("gpt", marks=pytest.mark.slow), "bert"])
def test_gpt_and_bert_with_cudnn_wrapper_equal_xla(monkeypatch, family):
    """GPT-2 (causal, learned positions, scaled logits) and BERT (padding as sequence
    lengths) with the cudnn wrapper: the XLA attention's logits and gradients."""
    monkeypatch.setattr(GA, "CUDNN_IMPLEMENTATION", "xla")
    preset = {"gpt": presets.gpt2, "bert": presets.bert}[family]("tiny").model
    cfg = dataclasses.replace(preset, vocab_size=64, d_model=32, num_heads=2, head_dim=16,
                              d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
                              dropout_rate=0.0, max_length=64, pooler=False,
                              mlm_predict_fraction=0.0, nsp_head=False)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 64, (2, 40)).astype(np.int32)
    if family == "gpt":
        batch = dict(decoder_input_tokens=tokens, decoder_target_tokens=np.roll(tokens, -1, 1),
                     decoder_loss_weights=np.ones((2, 40), np.float32))
    else:
        tokens[1, 25:] = 0  # a right-padded row
        batch = dict(encoder_input_tokens=tokens, encoder_target_tokens=tokens,
                     encoder_loss_weights=(tokens > 0).astype(np.float32))
    _assert_models_agree(cfg, "cudnn", {k: jnp.asarray(v) for k, v in batch.items()})


# ----------------------------------------------------------------------------- lowering, choice


def test_flash_gpu_lowers_to_triton_for_cuda():
    """The kernel's forward and both backward passes lower to Triton IR for CUDA on this CPU
    host (jax builds the Triton module here; an op or shape Triton cannot take fails): T5
    base's heads at 64-slot blocks, bfloat16, packed."""
    seg = jnp.ones((2, 256), jnp.int32)

    def loss(q, k, v, table):
        bias = GA.FlashGpuBias(seg, seg, table, "relative", causal=True, bidirectional=False)
        return jnp.sum(bias.attend(q, k, v).astype(jnp.float32))

    x = jax.ShapeDtypeStruct((2, 256, 12, 64), jnp.bfloat16)
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(
        x, x, x, jax.ShapeDtypeStruct((12, 32), jnp.float32)).lower(
            lowering_platforms=("cuda",))
    assert lowered.as_text().count("triton") >= 3


def test_auto_picks_per_backend():
    """"auto": on a GPU cudnn where it covers the model (bf16 compute, no attention dropout
    in training), else flash_gpu (head_dim a power of two), else xla; TPU and CPU xla (TPU
    as before the choice existed: "flash" is chosen by name)."""
    cfg = dataclasses.replace(T5, attention_kernel="auto", dtype="bfloat16")
    assert GA.resolve(cfg, backend="tpu") == "xla"
    assert GA.resolve(cfg, backend="gpu") == "cudnn"
    assert GA.resolve(cfg, backend="cpu") == "xla"
    f32 = dataclasses.replace(cfg, dtype="float32")
    assert GA.resolve(f32, backend="gpu") == "flash_gpu"
    assert GA.resolve(dataclasses.replace(f32, head_dim=24), backend="gpu") == "xla"
    assert GA.resolve(dataclasses.replace(cfg, head_dim=24), backend="gpu") == "cudnn"
    assert GA.resolve(dataclasses.replace(cfg, head_dim=256), backend="gpu") == "flash_gpu"
    dropout = dataclasses.replace(cfg, dropout_rate=0.1)
    assert GA.resolve(dropout, deterministic=False, backend="gpu") == "xla"
    assert GA.resolve(dropout, deterministic=True, backend="gpu") == "cudnn"
    for mixer in (dict(architecture="prefix_lm"), dict(attention_type="lightweight_conv"),
                  dict(funnel_blocks=(1, 1))):
        assert GA.resolve(dataclasses.replace(cfg, **mixer), backend="gpu") == "xla"


def test_kernels_refuse_what_they_lack():
    """A named kernel that cannot cover the model or run on this backend: one line saying
    what to do."""
    cfg = dataclasses.replace(T5, dtype="bfloat16")
    cases = [("cudnn", {}, "cpu", "needs a CUDA GPU"),
             ("cudnn", {}, "tpu", "needs a CUDA GPU"),
             ("cudnn", {"dtype": "float32"}, "gpu", "model.dtype=bfloat16"),
             ("cudnn", {"head_dim": 12}, "gpu", "head_dim"),
             ("flash_gpu", {}, "cpu", "need a GPU"),
             ("flash_gpu", {}, "tpu", "need a GPU"),
             ("flash_gpu", {"head_dim": 48}, "gpu", "power of two"),
             ("flash_gpu", {"architecture": "prefix_lm"}, "gpu", "prefix-LM"),
             ("flash_gpu", {"dropout_rate": 0.1}, "gpu", "dropout_rate=0")]
    for kernel, fields, backend, message in cases:
        bad = dataclasses.replace(cfg, attention_kernel=kernel, **fields)
        with pytest.raises(UserError, match=message) as info:
            GA.resolve(bad, deterministic=False, backend=backend)
        assert "\n" not in str(info.value) and "model.attention_kernel='xla'" in str(info.value)
