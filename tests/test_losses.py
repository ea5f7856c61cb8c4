"""Losses: cross entropy (label smoothing, z-loss), T5 normalisation, MLM + NSP, classification,
and micro-batch sums that equal the full-batch loss."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5lite.train import losses
from train_helpers import tiny_config
from numerics import assert_trees_close_at_scale


def _logits(shape, seed=0):
    return jax.random.normal(jax.random.key(seed), shape) * 3.0


def test_cross_entropy_matches_optax_and_t5x_label_smoothing():
    logits = _logits((2, 5, 11))
    targets = jax.random.randint(jax.random.key(1), (2, 5), 0, 11)
    ce, zl = losses.cross_entropy_with_logits(logits, targets, z_loss=1e-4)
    ref = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    np.testing.assert_allclose(ce, ref, rtol=1e-5)
    np.testing.assert_allclose(zl, 1e-4 * jax.nn.logsumexp(logits, -1) ** 2, rtol=1e-5)
    # label smoothing: soft targets (1-a on the label, a/(V-1) elsewhere) minus their entropy
    a, V = 0.1, 11
    ce_ls, _ = losses.cross_entropy_with_logits(logits, targets, label_smoothing=a)
    soft = jax.nn.one_hot(targets, V) * (1 - a) + (1 - jax.nn.one_hot(targets, V)) * a / (V - 1)
    entropy = -jnp.sum(soft * jnp.log(soft), -1)
    np.testing.assert_allclose(ce_ls, optax.softmax_cross_entropy(logits, soft) - entropy,
                               rtol=1e-5, atol=1e-5)
    # a confident correct prediction costs ~0 with smoothing too
    perfect = jnp.log(soft[:1, :1])
    ce0, _ = losses.cross_entropy_with_logits(perfect, targets[:1, :1], label_smoothing=a)
    np.testing.assert_allclose(ce0, 0.0, atol=1e-5)


def _lm_batch():
    rng = np.random.default_rng(0)
    w = (rng.random((4, 6)) < 0.7).astype(np.int32)
    return {"decoder_target_tokens": rng.integers(0, 11, (4, 6)).astype(np.int32),
            "decoder_loss_weights": w}


def test_token_loss_normalisation_real_tokens_or_t5_factor():
    cfg = tiny_config()
    cfg.train.z_loss = 0.0
    batch = _lm_batch()
    out = {"logits": _logits((4, 6, 11))}
    ce = optax.softmax_cross_entropy_with_integer_labels(out["logits"],
                                                         batch["decoder_target_tokens"])
    w = batch["decoder_loss_weights"]
    loss, m = losses.compute_loss(cfg, out, batch)
    np.testing.assert_allclose(loss, jnp.sum(ce * w) / w.sum(), rtol=1e-5)
    assert float(m["num_tokens"]) == w.sum()
    cfg.train.loss_normalizing_factor = 1000.0
    loss, m = losses.compute_loss(cfg, out, batch)
    np.testing.assert_allclose(loss, jnp.sum(ce * w) / 1000.0, rtol=1e-5)
    np.testing.assert_allclose(m["cross_entropy"], jnp.sum(ce * w) / w.sum(), rtol=1e-5)


def test_micro_batch_terms_sum_to_the_full_batch_loss():
    cfg = tiny_config()
    batch = _lm_batch()
    out = {"logits": _logits((4, 6, 11))}
    full, fm = losses.compute_loss(cfg, out, batch)
    norms = losses.normalizers(cfg, batch)
    parts = [losses.compute_loss(cfg, {"logits": out["logits"][i::2]},
                                 {k: v[i::2] for k, v in batch.items()}, norms) for i in (0, 1)]
    np.testing.assert_allclose(sum(p[0] for p in parts), full, rtol=1e-5)
    np.testing.assert_allclose(sum(p[1]["accuracy"] for p in parts), fm["accuracy"], rtol=1e-5)


def test_bert_mlm_plus_nsp_and_classification():
    cfg = tiny_config("encoder_only")
    cfg.train.z_loss = 0.0
    rng = np.random.default_rng(1)
    batch = {"encoder_target_tokens": rng.integers(0, 11, (4, 6)).astype(np.int32),
             "encoder_loss_weights": (rng.random((4, 6)) < 0.3).astype(np.int32),
             "nsp_labels": np.array([0, 1, 1, 0], np.int32)}
    batch["encoder_loss_weights"][:, 0] = 1
    out = {"logits": _logits((4, 6, 11)), "nsp_logits": _logits((4, 2), 2)}
    loss, m = losses.compute_loss(cfg, out, batch)
    w = batch["encoder_loss_weights"]
    mlm = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(
        out["logits"], batch["encoder_target_tokens"]) * w) / w.sum()
    nsp = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out["nsp_logits"],
                                                                   batch["nsp_labels"]))
    np.testing.assert_allclose(m["mlm_loss"], mlm, rtol=1e-5)
    np.testing.assert_allclose(m["nsp_loss"], nsp, rtol=1e-5)
    np.testing.assert_allclose(loss, mlm + nsp, rtol=1e-5)
    # a classification head replaces the token loss
    cls = {"logits": out["logits"], "class_logits": _logits((4, 3), 3)}
    labels = np.array([0, 2, 1, 2], np.int32)
    loss, m = losses.compute_loss(cfg, cls, dict(batch, class_labels=labels))
    np.testing.assert_allclose(loss, jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
        cls["class_logits"], labels)), rtol=1e-5)
    assert float(m["accuracy"]) == np.mean(np.argmax(cls["class_logits"], -1) == labels)


def test_cross_entropy_hand_written_gradient_matches_autodiff():
    """The custom VJP (one fused pass over the vocabulary) equals autodiff of the plain formula,
    with and without label smoothing and z-loss, for any cotangents of both outputs."""
    logits = _logits((2, 5, 11))
    targets = jax.random.randint(jax.random.key(1), (2, 5), 0, 11)
    g_ce, g_z = _logits((2, 5), 2), _logits((2, 5), 3)

    def reference(x, a, z):
        log_probs = jax.nn.log_softmax(x, -1)
        soft = jax.nn.one_hot(targets, 11) * (1 - a) + (1 - jax.nn.one_hot(targets, 11)) * (
            a / 10)
        entropy = -jnp.sum(soft * jnp.log(soft + 1e-20), -1) if a else 0.0
        return -jnp.sum(soft * log_probs, -1) - entropy, z * jax.nn.logsumexp(x, -1) ** 2

    for a, z in [(0.0, 0.0), (0.0, 1e-2), (0.1, 1e-2)]:
        def objective(fn):
            return lambda x: jnp.sum(fn(x)[0] * g_ce) + jnp.sum(fn(x)[1] * g_z)
        ours = jax.grad(objective(lambda x: losses.cross_entropy_with_logits(x, targets, a, z)))
        ref = jax.grad(objective(lambda x: reference(x, a, z)))
        np.testing.assert_allclose(ours(logits), ref(logits), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(losses.cross_entropy_with_logits(logits, targets, a, z)[0],
                                   reference(logits, a, z)[0], rtol=1e-5, atol=1e-5)


def _bert_mlm_batch(rng, batch, length, vocab, rate):
    targets = rng.integers(5, vocab, (batch, length)).astype(np.int32)
    weights = (rng.random((batch, length)) < rate).astype(np.int32)
    return {"encoder_input_tokens": np.where(weights, 3, targets).astype(np.int32),
            "encoder_target_tokens": targets, "encoder_loss_weights": weights,
            "encoder_segment_ids": np.ones_like(targets),
            "encoder_positions": np.broadcast_to(np.arange(length), targets.shape).astype(np.int32)}


def test_bert_mlm_head_on_gathered_masked_positions_equals_every_position():
    """model.mlm_predict_fraction > 0 runs the MLM head only on masked positions (Google BERT's
    masked_lm_positions): same loss, metrics and gradients while no row has more than N."""
    from t5lite.models import build_model, presets
    full_cfg = presets.bert("tiny")
    full_cfg.model.mlm_predict_fraction, full_cfg.model.dropout_rate = 0.0, 0.0
    full_cfg.model.nsp_head, full_cfg.model.vocab_size = True, 512
    full_cfg.model.num_encoder_layers = 1
    cap_cfg = presets.bert("tiny")
    cap_cfg.model = dataclasses.replace(full_cfg.model, mlm_predict_fraction=0.25)
    batch = _bert_mlm_batch(np.random.default_rng(0), 3, 48, full_cfg.model.vocab_size, 0.2)
    batch["nsp_labels"] = np.array([0, 1, 0], np.int32)
    assert batch["encoder_loss_weights"].sum(1).max() <= 12
    full, capped = build_model(full_cfg.model), build_model(cap_cfg.model)
    params = jax.jit(full.init)(jax.random.key(0), batch)["params"]

    def run(model, cfg):
        def f(p):
            out = model.apply({"params": p}, batch)
            loss, metrics = losses.compute_loss(cfg, out, batch)
            return loss, (out, metrics)
        return jax.jit(jax.value_and_grad(f, has_aux=True))(params)

    (l_full, (o_full, m_full)), g_full = run(full, full_cfg)
    (l_cap, (o_cap, m_cap)), g_cap = run(capped, cap_cfg)
    assert o_full["logits"].shape == (3, 48, full_cfg.model.vocab_size)
    assert o_cap["logits"].shape == (3, 12, full_cfg.model.vocab_size)
    pos = np.asarray(o_cap["logits_positions"])
    w = batch["encoder_loss_weights"]
    for b in range(3):  # the masked positions, in order, first
        n = w[b].sum()
        np.testing.assert_array_equal(pos[b, :n], np.nonzero(w[b])[0])
    np.testing.assert_allclose(o_cap["logits"], np.take_along_axis(
        np.asarray(o_full["logits"]), pos[..., None], axis=1), atol=1e-5)
    np.testing.assert_allclose(l_cap, l_full, rtol=1e-6)
    for k in ("mlm_loss", "nsp_loss", "accuracy", "num_tokens"):
        np.testing.assert_allclose(m_cap[k], m_full[k], rtol=1e-6)
    assert float(m_cap["mlm_dropped_fraction"]) == 0.0
    assert_trees_close_at_scale(g_cap, g_full)


def test_bert_mlm_cap_scores_the_first_n_masked_tokens_and_reports_the_rest():
    from t5lite.models import build_model, presets
    cfg = presets.bert("tiny")
    cfg.model = dataclasses.replace(cfg.model, mlm_predict_fraction=0.125,
                                    dropout_rate=0.0, vocab_size=512)
    batch = _bert_mlm_batch(np.random.default_rng(1), 2, 32, cfg.model.vocab_size, 0.4)
    w = batch["encoder_loss_weights"]
    assert w.sum(1).min() > 4
    model = build_model(cfg.model)
    params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
    out = model.apply({"params": params}, batch)
    loss, m = losses.compute_loss(cfg, out, batch)
    first4 = np.stack([np.nonzero(w[b])[0][:4] for b in range(2)])
    np.testing.assert_array_equal(out["logits_positions"], first4)
    ce = optax.softmax_cross_entropy_with_integer_labels(
        out["logits"], np.take_along_axis(batch["encoder_target_tokens"], first4, 1))
    np.testing.assert_allclose(m["cross_entropy"], ce.sum() / w.sum(), rtol=1e-5)
    np.testing.assert_allclose(m["mlm_dropped_fraction"], (w.sum() - 8) / w.sum(), rtol=1e-6)


def _gpt_classify():
    """A tiny GPT classifier and a padded classification batch (segment id 0 = padding)."""
    import flax.linen as nn
    from t5lite.models import build_model
    cfg = tiny_config()
    cfg.model.num_classes = 3
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 128, (3, 8)).astype(np.int32)
    seg = np.ones((3, 8), np.int32)
    seg[0, 5:], seg[1, 2:] = 0, 0
    batch = {"decoder_input_tokens": tokens, "decoder_segment_ids": seg,
             "decoder_positions": np.tile(np.arange(8, dtype=np.int32), (3, 1)) * seg,
             "class_labels": np.array([0, 2, 1], np.int32)}
    model = build_model(cfg.model)
    params = nn.meta.unbox(jax.jit(model.init)({"params": jax.random.key(0)}, batch)["params"])
    return cfg, model, params, batch


def test_gpt1_auxiliary_lm_loss_on_decoder_only_classification():
    cfg, model, params, batch = _gpt_classify()
    out = model.apply({"params": params}, batch)
    assert out["logits"].shape == (3, 8, 128) and out["class_logits"].shape == (3, 3)
    # lambda = 0 is today's loss, value and gradient
    loss0, m0 = losses.compute_loss(cfg, out, batch)
    assert "lm_loss" not in m0
    np.testing.assert_allclose(loss0, m0["class_loss"], rtol=1e-6)
    # the LM term by hand: next-token log-softmax over each row's real tokens only
    logp = np.asarray(jax.nn.log_softmax(out["logits"].astype(jnp.float32)), np.float64)
    terms = [-logp[b, t, batch["decoder_input_tokens"][b, t + 1]]
             for b, n in enumerate(batch["decoder_segment_ids"].sum(1)) for t in range(n - 1)]
    assert len(terms) == 4 + 1 + 7
    cfg.train.aux_lm_weight = 0.5
    loss, m = losses.compute_loss(cfg, out, batch)
    np.testing.assert_allclose(m["lm_loss"], np.mean(terms), rtol=1e-5)
    np.testing.assert_allclose(loss, m["class_loss"] + 0.5 * np.mean(terms), rtol=1e-5)
    np.testing.assert_allclose(m["class_loss"], m0["class_loss"], rtol=1e-6)
    # micro-batches with the full batch's normalisers sum to the full loss
    norms = losses.normalizers(cfg, batch)
    parts = [losses.compute_loss(cfg, {k: v[i::2] for k, v in out.items()},
                                 {k: v[i::2] for k, v in batch.items()}, norms)[0]
             for i in (0, 1)]
    np.testing.assert_allclose(sum(parts), loss, rtol=1e-5)

    def grads(weight):
        cfg.train.aux_lm_weight = weight
        f = lambda p: losses.compute_loss(cfg, model.apply({"params": p}, batch), batch)[0]
        return jax.grad(f)(params)
    g0, g_half = grads(0.0), grads(0.5)
    cfg.train.aux_lm_weight = 0.0
    ref = jax.grad(lambda p: losses.compute_loss(cfg, model.apply({"params": p}, batch),
                                                 batch)[1]["class_loss"])(params)
    assert_trees_close_at_scale(g0, ref, rtol=1e-5)
    emb = lambda g: np.asarray(g["token_embedder"]["embedding"])  # noqa: E731
    assert not np.allclose(emb(g_half), emb(g0))  # the LM term trains the (tied) embeddings


def test_aux_lm_weight_needs_a_decoder_only_classifier():
    import pytest
    from t5lite import config as config_lib
    from t5lite.errors import UserError
    cfg = tiny_config()
    cfg.train.aux_lm_weight = 0.5
    with pytest.raises(UserError, match="aux_lm_weight"):
        config_lib.validate(cfg)
    cfg.model.num_classes = 2
    config_lib.validate(cfg)
    with pytest.raises(UserError, match="aux_lm_weight"):
        config_lib.replace(cfg, {"train.aux_lm_weight": -1.0})
