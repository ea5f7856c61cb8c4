"""The flash attention kernel (models/flash_attention.py) against the model's XLA attention, in
Pallas interpret mode on CPU: forward and every gradient (inputs, projections, the relative
bias table) on packed and padded rows, for encoder self-attention, decoder causal
self-attention, cross-attention and ALiBi, in float32 and bfloat16; the whole T5 model with
model.attention_kernel="flash" against "xla"; and the kernel's cost count.

Shapes are small with small blocks (interpret mode compiles every kernel: a few seconds each),
but every test runs several query and key blocks, so online softmax, causal block skipping,
the bias made from block offsets and the per-bucket gradient all cross block edges. Rows with
no visible key (padding queries) are left out of comparisons: both paths leave them
unspecified.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.config import ModelConfig
from t5lite.errors import UserError
from t5lite.models import build_model, flash_attention as F, flash_bias, flash_kernels
from t5lite.models import layers as L
from t5lite.models.positions import RelativePositionBias, alibi_bias
from t5lite.train import losses

KEY = functools.partial(jax.random.key, impl="rbg")
BLOCKS = dict(block_q=32, block_k=64)  # interpret mode allows blocks below TPU's 128 lanes


def _segments(rows, length):
    """[B, L] segment ids from per-row segment lengths (1, 2, ... then 0 = padding)."""
    out = np.zeros((len(rows), length), np.int32)
    for r, lengths in enumerate(rows):
        start = 0
        for s_id, n in enumerate(lengths, 1):
            out[r, start:start + n] = s_id
            start += n
    return jnp.asarray(out)


# packed (two or three segments) and padded rows; 150 / 100 slots: 5 / 2 query blocks and 3 / 2
# key blocks, neither a multiple of its block (the wrapper pads)
Q_SEG = _segments([(40, 70, 25), (150,), (60, 30)], 150)
KV_SEG = _segments([(30, 50, 20), (100,), (70, 10)], 100)


def _attention_module(cfg, cross=False, flash=False):
    return L.MultiHeadAttention(dataclasses.replace(cfg, dropout_rate=0.0), cross=cross,
                                backend=F.FLASH_ATTENTION if flash else L.XLA_ATTENTION)


def _xla_bias(cfg, q_seg, kv_seg, kind, causal, table):
    """The model's bias: the mask of layers.py plus the position bias of positions.py."""
    if q_seg is kv_seg:
        mask = L.self_attention_mask(q_seg != 0, q_seg, causal)
    else:
        mask = L.cross_attention_mask(q_seg != 0, kv_seg != 0, q_seg, kv_seg)
    bias = L.attention_bias(mask)
    t, s = q_seg.shape[1], kv_seg.shape[1]
    pos_q, pos_k = jnp.arange(t)[None], jnp.arange(s)[None]
    if kind == "relative":
        module = RelativePositionBias(table.shape[1], cfg.relative_max_distance, cfg.num_heads,
                                      not causal)
        bias = bias + module.apply({"params": {"rel_embedding": table}}, pos_q, pos_k)
    elif kind == "alibi":
        bias = bias + alibi_bias(pos_q, pos_k, cfg.num_heads)
    return bias


def _run(cfg, kind, causal, cross, flash):
    """loss(params, x, kv, table) of one attention layer and its gradients: the model's
    MultiHeadAttention with the XLA bias or (backend FLASH_ATTENTION) a KernelBias."""
    q_seg = Q_SEG if cross else Q_SEG[:, :100] if causal else KV_SEG
    kv_seg = KV_SEG if cross else q_seg
    b, t, s = q_seg.shape[0], q_seg.shape[1], kv_seg.shape[1]
    module = _attention_module(cfg, cross, flash)
    x = jax.random.normal(KEY(1), (b, t, cfg.d_model)).astype(cfg.dtype)
    kv = jax.random.normal(KEY(2), (b, s, cfg.d_model)).astype(cfg.dtype)
    table = jax.random.normal(KEY(3), (cfg.num_heads, cfg.relative_buckets))
    params = _attention_module(cfg, cross).init(KEY(0), x, kv, jnp.zeros((1, 1, t, s)))["params"]
    weight = jax.random.normal(KEY(4), (b, t, cfg.d_model)) * (q_seg != 0)[..., None]

    def loss(params, x, kv, table):
        if flash:
            bias = F.KernelBias(q_seg, kv_seg, table if kind == "relative" else None, kind,
                                causal=causal, bidirectional=not causal,
                                max_distance=cfg.relative_max_distance, **BLOCKS)
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
                       relative_max_distance=24, dtype=dtype, **kw)


def _assert_close(flash, xla, rtol):
    out_f, grads_f = flash
    out_x, grads_x = xla
    scale = np.max(np.abs(out_x))
    np.testing.assert_allclose(out_f, out_x, atol=rtol * scale, rtol=0)
    for path, (gf, gx) in zip(jax.tree_util.tree_leaves_with_path(grads_f),
                              zip(jax.tree.leaves(grads_f), jax.tree.leaves(grads_x))):
        np.testing.assert_allclose(gf, gx, atol=rtol * np.max(np.abs(gx)), rtol=0,
                                   err_msg=jax.tree_util.keystr(path[0]))


# (bias kind, causal, cross): encoder self-attention (bidirectional relative buckets),
# decoder causal self-attention (unidirectional buckets), cross-attention (no bias), ALiBi
CASES = {"encoder": ("relative", False, False), "decoder": ("relative", True, False),
         "cross": ("none", False, True), "alibi_causal": ("alibi", True, False)}


# encoder, decoder and cross also run inside the whole-model test below (marked slow here to
# keep the suite fast; `pytest --runslow` runs them)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c != "alibi_causal"
                                  else c for c in CASES])
def test_kernel_equals_model_attention_float32(case):
    """Forward and the gradients of the projections, both inputs and the bias table agree
    with the XLA attention to float32 rounding (1e-5 of each array's largest entry)."""
    kind, causal, cross = CASES[case]
    cfg = _config()
    _assert_close(_run(cfg, kind, causal, cross, True), _run(cfg, kind, causal, cross, False),
                  1e-5)


def test_kernel_equals_model_attention_bfloat16():
    """bfloat16 compute: the kernel keeps logits and probabilities in float32 where the XLA
    path rounds logits and probabilities to bfloat16, so agreement is to bfloat16 rounding:
    2e-2 of each array's largest entry (both paths' distance to a float32 run is ~1e-2)."""
    cfg = _config("bfloat16")
    _assert_close(_run(cfg, "relative", False, False, True),
                  _run(cfg, "relative", False, False, False), 2e-2)


def test_bucket_runs_are_the_models_buckets():
    """The kernel's step function of distances gives positions.py's bucket at every distance,
    both directions, including far beyond max_distance."""
    for bidirectional in (True, False):
        runs = flash_bias.bucket_runs(32, 128, bidirectional)
        rel = np.arange(-5000, 5001)
        starts = np.asarray([r for r, _ in runs])
        run = np.maximum(np.searchsorted(starts, rel, "right") - 1, 0)  # first: from -inf
        kernel = np.asarray([b for _, b in runs])[run]
        model = RelativePositionBias(32, 128, 1, bidirectional).bucket(jnp.asarray(rel))
        np.testing.assert_array_equal(kernel, np.asarray(model))


# ----------------------------------------------------------------------------- whole model


def _packed_batch(seed=0, encoder=([(40, 50), (70,)], 100), decoder=([(12, 20), (25,)], 40)):
    """Two rows of packed, padded encoder-decoder data (seqio's packed features); ``encoder``
    / ``decoder``: each row's segment lengths and the row length (_segments' arguments)."""
    rng = np.random.default_rng(seed)
    enc_seg, dec_seg = _segments(*encoder), _segments(*decoder)
    batch = {}
    for prefix, seg in (("encoder", enc_seg), ("decoder", dec_seg)):
        seg = np.asarray(seg)
        pos = np.zeros_like(seg)
        for r in range(seg.shape[0]):
            for s_id in set(seg[r]) - {0}:
                pos[r, seg[r] == s_id] = np.arange(np.sum(seg[r] == s_id))
        batch[f"{prefix}_input_tokens"] = np.where(seg > 0, rng.integers(1, 64, seg.shape), 0)
        batch[f"{prefix}_segment_ids"], batch[f"{prefix}_positions"] = seg, pos
    batch["decoder_target_tokens"] = np.where(dec_seg > 0, rng.integers(1, 64, dec_seg.shape), 0)
    batch["decoder_loss_weights"] = (np.asarray(dec_seg) > 0).astype(np.float32)
    return {k: jnp.asarray(v) for k, v in batch.items()}


def test_t5_model_with_flash_equals_xla(monkeypatch):
    """A tiny T5 (relative bias in encoder and decoder, cross-attention, scanned layers) with
    model.attention_kernel="flash": logits at real tokens, loss and every parameter's
    gradient equal the XLA attention's (float32 rounding). 16-slot blocks: every attention
    spans several query and key blocks (48 encoder, 24 decoder slots: the interpreted kernel's
    cost grows with the blocks)."""
    monkeypatch.setattr(F, "DEFAULT_BLOCK", 16)
    batch = _packed_batch(encoder=([(20, 18), (30,)], 48), decoder=([(10, 12), (16,)], 24))
    base = ModelConfig(vocab_size=64, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                       num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0,
                       relative_max_distance=24)
    results = []
    for kernel in ("xla", "flash"):
        cfg = dataclasses.replace(base, attention_kernel=kernel)
        model = build_model(cfg)
        params = nn.meta.unbox(jax.jit(model.init)(KEY(0), batch)["params"])

        def loss(params):
            logits = model.apply({"params": params}, batch)["logits"]
            xent, _ = losses.cross_entropy_with_logits(logits, batch["decoder_target_tokens"])
            return jnp.sum(xent * batch["decoder_loss_weights"]), logits

        (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        results.append((value, np.asarray(logits)[np.asarray(batch["decoder_loss_weights"]) > 0],
                        grads))
    (loss_x, logits_x, grads_x), (loss_f, logits_f, grads_f) = results
    np.testing.assert_allclose(loss_f, loss_x, rtol=1e-5)
    np.testing.assert_allclose(logits_f, logits_x, atol=1e-4)
    assert jax.tree.structure(grads_f) == jax.tree.structure(grads_x)
    for (path, gf), gx in zip(jax.tree_util.tree_leaves_with_path(grads_f),
                              jax.tree.leaves(grads_x)):
        np.testing.assert_allclose(gf, gx, atol=1e-5 * max(np.max(np.abs(gx)), 1e-3),
                                   err_msg=jax.tree_util.keystr(path))


def test_flash_refuses_what_it_lacks():
    """Attention dropout in training and the prefix-LM mask: one line saying what to do."""
    batch = _packed_batch()
    cfg = ModelConfig(vocab_size=64, d_model=32, num_heads=2, head_dim=16, d_ff=64,
                      num_encoder_layers=1, num_decoder_layers=1, attention_kernel="flash")
    model = build_model(cfg)
    with pytest.raises(UserError, match="dropout_rate=0"):
        model.init({"params": KEY(0), "dropout": KEY(1)}, batch, deterministic=False)
    prefix = build_model(dataclasses.replace(cfg, architecture="prefix_lm", dropout_rate=0.0))
    dec = {k: v for k, v in batch.items() if k.startswith("decoder")}
    with pytest.raises(UserError, match="prefix-LM"):
        prefix.init(KEY(0), dict(dec, decoder_causal_attention=dec["decoder_segment_ids"] > 0))


# ----------------------------------------------------------------------------- costs


def test_visited_tiles_and_flops():
    """The analytic count visits exactly the tiles with a visible key: all of them without
    the causal mask, the ones on or below the diagonal with it (brute force over slots)."""
    for bq, bk, t in ((32, 64, 256), (64, 32, 256), (128, 128, 512)):
        spec = flash_kernels.KernelSpec(causal=True, block_q=bq, block_k=bk)
        slots = np.arange(t)
        visible = slots[None, :] <= slots[:, None]
        brute = sum(visible[i:i + bq, j:j + bk].any() for i in range(0, t, bq)
                    for j in range(0, t, bk))
        assert F.visited_tiles(spec, t, t) == brute
        assert F.visited_tiles(dataclasses.replace(spec, causal=False), t, t) == (t // bq) * (
            t // bk)
    spec = flash_kernels.KernelSpec(causal=True, block_q=128, block_k=128)
    q = jax.ShapeDtypeStruct((2, 3, 512, 64), jnp.bfloat16)
    assert F.forward_cost(spec, q, q).flops == 2 * 2 * 2 * 3 * 10 * 128 * 128 * 64


def test_compile_counts_the_kernel_for_tpu():
    """The kernel compiles for a v5p chip (Mosaic, on this CPU host), and tpu/hlo_cost.py
    counts its FLOPs and HBM bytes from the estimate its custom call carries."""
    pytest.importorskip("libtpu")
    from t5lite.mesh import topology
    from t5lite.tpu import hlo_cost
    device = topology.abstract_devices(topology.parse_topology("v5p:2x2x1"))[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((1, 1024, 2, 64), jnp.bfloat16, sharding=sharding)
    seg = jax.ShapeDtypeStruct((1, 1024), jnp.int32, sharding=sharding)
    attend = jax.jit(lambda q, k, v, seg: F.KernelBias(seg, seg, causal=True).attend(q, k, v))
    costs = hlo_cost.hlo_costs(attend.lower(x, x, x, seg).compile().as_text())
    spec = flash_kernels.KernelSpec(causal=True, block_q=512, block_k=512)
    q_BHTK = jax.ShapeDtypeStruct((1, 2, 1024, 64), jnp.bfloat16)
    expected = F.forward_cost(spec, q_BHTK, q_BHTK)
    assert costs["kernel_flops"] == expected.flops == 2 * 2 * 2 * 3 * 512 * 512 * 64
    assert costs["kernel_bytes"] == expected.bytes_accessed
    assert costs["matmul_flops"] >= expected.flops


def test_sharded_kernel_equals_unsharded():
    """Under a mesh (batch over data, heads over tensor: the logical rules) the kernel runs
    per shard in shard_map; outputs and gradients, the table's included (split by heads,
    summed over batch shards), equal one unsharded kernel's."""
    from t5lite.config import MeshConfig
    from t5lite.mesh import partitioning
    q_seg = KV_SEG[:, :96].at[1, 50:].set(0)
    q_seg = jnp.concatenate([q_seg, q_seg[:1]])  # 4 rows: two per data shard
    x = jax.random.normal(KEY(1), (3, 4, 96, 2, 16))
    table = jax.random.normal(KEY(2), (2, 32))

    def loss(table, q, k, v):
        out = F.KernelBias(q_seg, q_seg, table, "relative", **BLOCKS).attend(q, k, v)
        return jnp.sum(out * jnp.cos(out) * (q_seg != 0)[..., None, None])

    grad = jax.grad(loss, argnums=(0, 1, 2, 3))
    alone = jax.jit(grad)(table, *x)
    mesh = partitioning.make_mesh(MeshConfig(data=2, fsdp=1, tensor=2), jax.devices()[:4])
    with partitioning.activate(mesh):
        sharded = jax.jit(grad)(table, *x)
    for a, s in zip(alone, sharded):
        np.testing.assert_allclose(s, a, atol=1e-5 * np.max(np.abs(a)))
