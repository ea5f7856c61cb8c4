"""Finetuning heads: BERT [CLS] / sentence-pair classification, token tagging on first
sub-tokens, QA spans; GPT last-token classification; their losses; the GPT classification
converter; and (slow) a tiny BERT finetuned on the local sentiment data."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow as tf
from flax import linen as nn

from t5lite import config as config_lib
from t5lite.config import ModelConfig
from t5lite.models import build_model, dummy_batch
from t5lite.tasks import classification
from t5lite.train import losses

B, L, C, T = 4, 10, 3, 5


def bert_cfg(**kw) -> ModelConfig:
    base = dict(architecture="encoder_only", vocab_size=64, d_model=32, num_heads=4, head_dim=8,
                d_ff=64, num_encoder_layers=2, dropout_rate=0.0, position="learned",
                max_length=32, norm="layernorm", pre_norm=False, embed_norm=True,
                use_bias=True, init_std=0.02, num_token_types=2, pooler=True, num_classes=C,
                num_token_classes=T, span_head=True)
    base.update(kw)
    return ModelConfig(**base)


def bert_batch(cfg, seed=0):
    rng = np.random.default_rng(seed)
    batch = dummy_batch(cfg, B, {"inputs": L})
    tokens = rng.integers(1, cfg.vocab_size, (B, L)).astype(np.int32)
    lengths = np.array([10, 8, 6, 9])
    tokens[np.arange(L)[None] >= lengths[:, None]] = 0
    batch["encoder_input_tokens"] = tokens
    batch["encoder_token_type_ids"] = (np.arange(L)[None] >= lengths[:, None] // 2).astype(
        np.int32) * (tokens != 0)
    batch["encoder_positions"] = np.tile(np.arange(L, dtype=np.int32), (B, 1))
    batch["encoder_segment_ids"] = (tokens != 0).astype(np.int32)
    batch["class_labels"] = rng.integers(0, C, B).astype(np.int32)
    batch["token_labels"] = rng.integers(0, T, (B, L)).astype(np.int32)
    batch["token_label_weights"] = ((rng.random((B, L)) < 0.6) & (tokens != 0)).astype(np.int32)
    batch["start_positions"] = np.array([1, 2, 0, 3], np.int32)
    batch["end_positions"] = np.array([4, 2, 3, 5], np.int32)
    return batch


def init(cfg, batch):
    model = build_model(cfg)
    params = nn.meta.unbox(model.init({"params": jax.random.key(0)}, batch)["params"])
    return model, params


def test_bert_heads_shapes_and_span_padding():
    cfg = bert_cfg()
    batch = bert_batch(cfg)
    model, params = init(cfg, batch)
    out = model.apply({"params": params}, batch)
    assert out["class_logits"].shape == (B, C)
    assert out["token_logits"].shape == (B, L, T)
    assert out["start_logits"].shape == out["end_logits"].shape == (B, L)
    pad = batch["encoder_input_tokens"] == 0
    assert np.all(np.asarray(out["start_logits"])[pad] < -1e9)  # padding is never a span end
    assert np.all(np.isfinite(np.asarray(out["end_logits"])[~pad]))
    # sentence pairs: the token type ids reach the classifier
    flipped = dict(batch, encoder_token_type_ids=1 - batch["encoder_token_type_ids"])
    assert not np.allclose(model.apply({"params": params}, flipped)["class_logits"],
                           out["class_logits"])


def test_head_losses_decrease_on_a_toy_batch():
    cfg = bert_cfg()
    batch = bert_batch(cfg)
    model, params = init(cfg, batch)
    full = config_lib.Config()
    tx = optax.adam(3e-3)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt):
        def loss_fn(p):
            return losses.compute_loss(full, model.apply({"params": p}, batch), batch)
        (_, m), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, updates), opt, m

    history = []
    for _ in range(15):
        params, opt, m = step(params, opt)
        history.append(jax.device_get(m))
    for key in ("class_loss", "token_loss", "span_loss"):
        assert history[-1][key] < 0.7 * history[0][key], key
    np.testing.assert_allclose(history[0]["loss"], history[0]["class_loss"]
                               + history[0]["token_loss"] + history[0]["span_loss"], rtol=1e-5)


def test_token_loss_counts_only_weighted_first_subtokens():
    cfg = bert_cfg()
    batch = bert_batch(cfg)
    model, params = init(cfg, batch)
    out = model.apply({"params": params}, batch)
    full = config_lib.Config()
    _, m = losses.compute_loss(full, out, batch)
    w = batch["token_label_weights"]
    other = dict(batch, token_labels=np.where(w == 1, batch["token_labels"],
                                              (batch["token_labels"] + 1) % T))
    _, m2 = losses.compute_loss(full, out, other)
    assert float(m["token_loss"]) == pytest.approx(float(m2["token_loss"]))
    logp = jax.nn.log_softmax(out["token_logits"])
    ce = -np.take_along_axis(np.asarray(logp), batch["token_labels"][..., None], -1)[..., 0]
    assert float(m["token_loss"]) == pytest.approx(float((ce * w).sum() / w.sum()), rel=1e-5)


def test_first_subtoken_labels():
    vocab = {"new": [5], "york": [6, 7], "is": [8], "bigger": [9, 10, 11]}
    out = classification.first_subtoken_labels(
        ["new", "york", "is", "bigger"], [1, 2, 0, 0], lambda w: vocab[w], length=8,
        cls_id=101, sep_id=102)
    np.testing.assert_array_equal(out["encoder_input_tokens"], [101, 5, 6, 7, 8, 102, 0, 0])
    np.testing.assert_array_equal(out["token_labels"], [0, 1, 2, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(out["token_label_weights"], [0, 1, 1, 0, 1, 0, 0, 0])


def gpt_cfg():
    return ModelConfig(architecture="decoder_only", vocab_size=64, d_model=32, num_heads=4,
                       head_dim=8, d_ff=64, num_decoder_layers=2, dropout_rate=0.0,
                       position="learned", max_length=32, norm="layernorm", use_bias=True,
                       init_std=0.02, num_classes=C)


@pytest.mark.slow  # the default run's guard: test_models.py's
# test_gpt_classifier_reads_last_real_token (padding ignored, the last real token read)
def test_gpt_pools_the_last_non_pad_token():
    """A padded row classifies like the same tokens without padding; what sits in the padding
    does not matter; the last real token does."""
    cfg = gpt_cfg()
    model = build_model(cfg)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, cfg.vocab_size, (2, 8)).astype(np.int32)
    seg = np.ones((2, 8), np.int32)
    seg[0, 5:] = 0
    batch = {"decoder_input_tokens": tokens, "decoder_segment_ids": seg,
             "decoder_positions": np.tile(np.arange(8, dtype=np.int32), (2, 1))}
    params = nn.meta.unbox(model.init({"params": jax.random.key(0)}, batch)["params"])
    fwd = jax.jit(lambda b: model.apply({"params": params}, b)["class_logits"])
    out = fwd(batch)
    short = {k: v[:1, :5] for k, v in batch.items()}
    np.testing.assert_allclose(out[0], fwd(short)[0], atol=1e-5)
    junk = dict(batch, decoder_input_tokens=np.where(seg == 0, 7, tokens))
    np.testing.assert_allclose(fwd(junk), out, atol=1e-6)
    last = tokens.copy()
    last[0, 4] = (last[0, 4] % (cfg.vocab_size - 1)) + 1
    assert not np.allclose(fwd(dict(batch, decoder_input_tokens=last))[0], out[0])


def test_decoder_classification_converter_marks_padding_by_length_not_id():
    ds = tf.data.Dataset.from_generator(
        lambda: iter([{"targets": np.array([0, 5, 9], np.int32), "class_labels": np.int32(1)},
                      {"targets": np.array([4, 0, 2, 3, 8], np.int32),
                       "class_labels": np.int32(0)}]),
        output_signature={"targets": tf.TensorSpec([None], tf.int32),
                          "class_labels": tf.TensorSpec([], tf.int32)})
    conv = classification.DecoderClassificationConverter()
    rows = list(conv(ds, {"targets": 5}).as_numpy_iterator())
    np.testing.assert_array_equal(rows[0]["decoder_input_tokens"], [0, 5, 9, 0, 0])
    np.testing.assert_array_equal(rows[0]["decoder_segment_ids"], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(rows[1]["decoder_segment_ids"], [1, 1, 1, 1, 1])
    np.testing.assert_array_equal(rows[1]["decoder_positions"], [0, 1, 2, 3, 4])
    assert rows[0]["class_labels"] == 1 and rows[1]["class_labels"] == 0


# ----------------------------------------------------------------------------- end to end


def _sentiment_ready():
    from t5lite import dataprep
    root = dataprep.data_dir()
    return all(os.path.exists(os.path.join(root, p)) for p in (
        "finetune/sentiment/train.tsv", "finetune/sentiment/validation.tsv",
        "vocab/bert/vocab.txt"))


@pytest.mark.slow
def test_tiny_bert_sentiment_beats_the_majority_class(tmp_path):
    """configs/tiny_bert_sentiment.py (shortened): held-out accuracy above the majority
    class of the validation split."""
    if not _sentiment_ready():
        pytest.skip("run `t5lite data prepare sentiment bert_vocab` first")
    from t5lite import dataprep
    from t5lite.train import trainer
    cfg = config_lib.load_config("tiny_bert_sentiment", ["train.steps=300",
                                                         "train.eval_steps=0"])
    workdir = str(tmp_path / "run")
    trainer.train(cfg, workdir)
    with open(os.path.join(dataprep.data_dir(), "finetune/sentiment/validation.tsv")) as f:
        labels = [line.rstrip("\n").split("\t")[1] for line in f if line.strip()]
    majority = max(labels.count(x) for x in set(labels)) / len(labels)
    acc = evaluate_accuracy(cfg, workdir, "validation")
    assert acc > majority + 0.03, (acc, majority)


def evaluate_accuracy(cfg, workdir, split):
    """Accuracy of the trained classifier over a whole split (one pass, no repeats)."""
    from t5lite.store import checkpointing
    from t5lite.tasks import pipeline
    _, params = checkpointing.load_params(workdir)
    model = build_model(cfg.model)
    fwd = jax.jit(lambda p, b: jnp.argmax(model.apply({"params": p}, b)["class_logits"], -1))
    ds = pipeline.get_dataset(cfg.data.mixture_or_task, dict(cfg.data.feature_lengths),
                              cfg.model.architecture, batch_size=64, split=split,
                              shuffle=False, pack=False, num_epochs=1, drop_remainder=False)
    right = total = 0
    for batch in ds.as_numpy_iterator():
        pred = np.asarray(fwd(params, batch))
        right += int((pred == batch["class_labels"]).sum())
        total += len(pred)
    return right / total
