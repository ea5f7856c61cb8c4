"""Synthesizers, lightweight / dynamic convolution, the Evolved Transformer, adaptive softmax,
mixture of softmaxes and adaptive input embeddings (Narang et al. 2021 rows): the behaviour
that defines each, on tiny models."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.config.model_schema import ModelConfig
from t5lite.errors import UserError
from t5lite.models import build_model, count_params, dummy_batch
from model_checks import assert_cached_decoding_equals_full_forward

V, D, L_ = 64, 16, 8
TINY = ModelConfig(vocab_size=V, d_model=D, num_heads=2, head_dim=8, d_ff=32,
                   num_encoder_layers=1, num_decoder_layers=1, max_length=16, dropout_rate=0.0,
                   scan_layers=False)


def make(arch="encoder_only", **fields):
    cfg = dataclasses.replace(TINY, architecture=arch, **fields)
    model = build_model(cfg)
    batch = dummy_batch(cfg, 2, {"inputs": L_, "targets": L_})
    rng = np.random.default_rng(0)
    for key in batch:
        if key.endswith("_tokens"):
            batch[key] = rng.integers(1, V, batch[key].shape).astype(np.int32)
    params = model.init(jax.random.key(0), batch)["params"]
    return cfg, model, params, batch


def sown(model, params, batch, name):
    """The first sown value called ``name`` (the one layer's)."""
    _, state = model.apply({"params": params}, batch, mutable=["intermediates"])
    found = [v for path, v in jax.tree_util.tree_flatten_with_path(
        state["intermediates"], is_leaf=lambda x: isinstance(x, tuple))[0]
        if str(getattr(path[-1], "key", "")) == name]
    return np.asarray(found[0][0])


def with_token(batch, key, position, token):
    out = {k: np.array(v) for k, v in batch.items()}
    out[key][:, position] = token
    return out


def test_random_synthesizer_weights_do_not_depend_on_the_input():
    cfg, model, params, batch = make(attention_type="synthesizer_random")
    other = with_token(batch, "encoder_input_tokens", slice(None), 7)
    a = sown(model, params, batch, "attention_weights")
    b = sown(model, params, other, "attention_weights")
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)
    assert params["encoder"]["layers_0"]["attention"]["R"].unbox().shape == (16, 2, 16)


@pytest.mark.parametrize("kind", ["synthesizer_dense", "synthesizer_factorized",
                                  "synthesizer_random_plus_alpha", "synthesizer_dense_plus"])
def test_synthesizer_weights_per_query_token(kind):
    """dense: a query's row depends on that token only; factorized: on nothing; the plus
    forms mix in the query-key dot product (other tokens move every row)."""
    cfg, model, params, batch = make(attention_type=kind)
    other = with_token(batch, "encoder_input_tokens", 3, 5)
    a = sown(model, params, batch, "attention_weights")
    b = sown(model, params, other, "attention_weights")
    rows = [t for t in range(L_) if t != 3]
    if kind == "synthesizer_factorized":
        np.testing.assert_allclose(a, b, atol=1e-6)
    elif kind == "synthesizer_dense":
        np.testing.assert_allclose(a[:, :, rows], b[:, :, rows], atol=1e-6)
        assert np.abs(a[:, :, 3] - b[:, :, 3]).max() > 1e-4
    else:
        assert np.abs(a[:, :, rows] - b[:, :, rows]).max() > 1e-4
    attention = params["encoder"]["layers_0"]["attention"]
    assert ("alpha" in attention) == kind.endswith("alpha")
    assert ("key" in attention) == ("plus" in kind)


def test_lightweight_conv_weights_softmaxed_and_shared_across_channel_groups():
    cfg, model, params, batch = make(attention_type="lightweight_conv", conv_heads=4,
                                     conv_kernel_size=3)
    w_WD = sown(model, params, batch, "conv_weights")
    assert w_WD.shape == (3, D)
    np.testing.assert_allclose(w_WD.sum(0), 1.0, atol=1e-6)
    groups = w_WD.reshape(3, 4, D // 4)  # 4 kernels, each on 4 consecutive channels
    np.testing.assert_array_equal(groups, np.repeat(groups[..., :1], D // 4, axis=-1))
    assert len({tuple(np.round(groups[:, g, 0], 6)) for g in range(4)}) == 4
    other = with_token(batch, "encoder_input_tokens", slice(None), 9)
    np.testing.assert_array_equal(w_WD, sown(model, params, other, "conv_weights"))


def test_dynamic_conv_kernels_per_position_and_causal_in_the_decoder():
    cfg, model, params, batch = make("decoder_only", attention_type="dynamic_conv",
                                     conv_kernel_size=3)
    w_BTWD = sown(model, params, batch, "conv_weights")
    assert w_BTWD.shape == (2, L_, 3, D)
    np.testing.assert_allclose(w_BTWD.sum(2), 1.0, atol=1e-5)
    assert np.abs(w_BTWD[:, 1] - w_BTWD[:, 2]).max() > 1e-4  # predicted per position
    logits = model.apply({"params": params}, batch)["logits"]
    later = model.apply({"params": params}, with_token(batch, "decoder_input_tokens", 5, 3))
    np.testing.assert_allclose(logits[:, :5], later["logits"][:, :5], atol=1e-6)
    assert np.abs(logits[:, 5:] - later["logits"][:, 5:]).max() > 1e-4


def test_convolution_taps_stay_inside_a_packed_segment():
    cfg, model, params, batch = make(attention_type="lightweight_conv", conv_kernel_size=5)
    batch["encoder_segment_ids"][:] = [1, 1, 1, 1, 2, 2, 2, 2]
    out = model.apply({"params": params}, batch)["logits"]
    moved = model.apply({"params": params}, with_token(batch, "encoder_input_tokens", 5, 2))
    np.testing.assert_allclose(out[:, :4], moved["logits"][:, :4], atol=1e-6)


@pytest.mark.parametrize("fields", [
    dict(output_softmax="adaptive", vocab_clusters=((20, 16), (30, 8), (14, 4))),
    dict(output_softmax="adaptive", vocab_clusters=("40:0", "24:0")),  # no projection
    dict(output_softmax="mixture", mos_components=3)])
def test_output_layer_is_a_distribution_over_the_whole_vocabulary(fields):
    cfg, model, params, batch = make("encoder_decoder", **fields)
    logp = model.apply({"params": params}, batch)["logits"]
    assert logp.shape == (2, L_, V)
    np.testing.assert_allclose(np.exp(logp).sum(-1), 1.0, atol=1e-5)
    if fields["output_softmax"] == "adaptive":  # p(tail cluster) from the head's extra rows
        head = params["token_embedder"]["cluster_0"]["embedding"].unbox()
        n0, tails = head.shape[0] - (len(cfg.vocab_clusters) - 1), len(cfg.vocab_clusters) - 1
        assert n0 == (20 if n0 == 20 else 40) and tails >= 1
        if n0 == 20:
            assert "projection" in params["token_embedder"]["cluster_1"]


def test_adaptive_input_clusters_and_projections():
    clusters = ((20, 0), (30, 8), (14, 4))
    cfg, model, params, batch = make("decoder_only", adaptive_input=True,
                                     vocab_clusters=clusters)
    table = params["token_embedder"]
    assert table["cluster_0"]["embedding"].unbox().shape == (20, D)
    assert "projection" not in table["cluster_0"]
    assert table["cluster_1"]["embedding"].unbox().shape == (30, 8)
    assert table["cluster_1"]["projection"].unbox().shape == (8, D)
    assert table["cluster_2"]["projection"].unbox().shape == (4, D)
    ids = jnp.array([[3, 25, 55]])
    emb = model.apply({"params": params}, ids, method=lambda m, t: m.token_embedder(t))
    e1, p1 = table["cluster_1"]["embedding"].unbox(), table["cluster_1"]["projection"].unbox()
    e2, p2 = table["cluster_2"]["embedding"].unbox(), table["cluster_2"]["projection"].unbox()
    np.testing.assert_allclose(emb[0, 0], table["cluster_0"]["embedding"].unbox()[3], atol=1e-6)
    np.testing.assert_allclose(emb[0, 1], e1[5] @ p1, atol=1e-5)
    np.testing.assert_allclose(emb[0, 2], e2[5] @ p2, atol=1e-5)
    assert count_params(cfg) < count_params(dataclasses.replace(cfg, adaptive_input=False))


@pytest.mark.parametrize("arch, fields", [
    ("decoder_only", dict(attention_type="dynamic_conv", conv_kernel_size=3)),
    ("decoder_only", dict(attention_type="synthesizer_random_plus")),
    ("encoder_decoder", dict(block_type="evolved"))])
def test_cached_decoding_equals_full_forward(arch, fields):
    cfg, model, params, batch = make(arch, **fields)
    assert_cached_decoding_equals_full_forward(model, params, batch, prefill=3)


def test_evolved_blocks_have_their_branches():
    cfg, model, params, batch = make("encoder_decoder", block_type="evolved")
    enc, dec = params["encoder"]["layers_0"], params["decoder"]["layers_0"]
    assert {"glu_linear", "glu_gate", "conv1x1", "conv3x1", "sep_conv9x1",
            "attention", "mlp"} <= set(enc)
    assert {"wide_self_attention", "branch_cross_attention", "sep_conv11x1", "sep_conv7x1_1",
            "sep_conv7x1_2", "self_attention", "encoder_decoder_attention", "mlp"} <= set(dec)
    assert enc["conv3x1"]["kernel"].unbox().shape == (3, D, D // 2)
    assert dec["wide_self_attention"]["query"]["kernel"].unbox().shape == (D, 2 * 2 * 8)
    assert np.isfinite(model.apply({"params": params}, batch)["logits"]).all()


@pytest.mark.parametrize("fields, says", [
    (dict(output_softmax="adaptive", vocab_clusters=((20, 0), (30, 0))), "sum to vocab_size"),
    (dict(adaptive_input=True, vocab_clusters=((64, 0),), tie_embeddings=False), "tied"),
    (dict(attention_type="lightweight_conv", conv_heads=3), "divide d_model"),
    (dict(attention_type="synthesizer_dense", position="rope"), "position=relative"),
    (dict(block_type="evolved", ffn_layer="switch"), "block_type"),
    (dict(attention_type="synthesizer_random", weighted_transformer=True), "set one of them"),
    (dict(attention_type="dynamic_conv", peft=dataclasses.replace(TINY.peft, lora_rank=4)),
     "LoRA on query")])
def test_config_errors_say_what_to_do(fields, says):
    with pytest.raises(UserError, match=says):
        build_model(dataclasses.replace(TINY, architecture="encoder_decoder", **fields))


def test_synthesizer_longer_than_max_length_is_one_line():
    with pytest.raises(UserError, match="model.max_length"):
        make(attention_type="synthesizer_random", max_length=4)
