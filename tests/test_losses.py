"""Losses: cross entropy (label smoothing, z-loss), T5 normalisation, MLM + NSP, classification,
and micro-batch sums that equal the full-batch loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5lite import losses
from train_helpers import tiny_config


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
