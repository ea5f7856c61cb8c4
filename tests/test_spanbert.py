"""SpanBERT (span masking + Span Boundary Objective) and the RoBERTa recipe (dynamic masking,
no NSP, full-sentence packing): statistics as for BERT's MLM, the converter's boundary
features, the SBO head and its loss, and real-pipeline checks on the test data dir."""

import dataclasses

import numpy as np
import pytest
import seqio

from t5lite.tasks import objectives

VOCAB_SIZE = 1000  # ordinary ids 3..899, 100 sentinels on top ([MASK] = 999, [CLS] 998, [SEP] 997)


class _WordVocab(seqio.PassThroughVocabulary):
    """Integer tokens (T5 layout: pad 0, eos 1, unk 2, 100 sentinels) whose ids divisible by 3
    continue a word (like WordPiece's ##x): so words are 1-3+ tokens long."""

    def __init__(self):
        super().__init__(size=VOCAB_SIZE - 100, eos_id=1)
        self._extra_ids = 100

    @property
    def unk_id(self):
        return 2

    def word_starts(self):
        return np.arange(VOCAB_SIZE - 100) % 3 != 0


VOCAB = _WordVocab()
FEATURES = {"inputs": seqio.Feature(VOCAB)}
SPECIAL = objectives.bert_special_ids(VOCAB)


def _docs(n, seed=0):
    import tensorflow as tf
    rng = np.random.RandomState(seed)
    docs = [rng.randint(3, 900, size=rng.randint(20, 400)).astype(np.int32) for _ in range(n)]
    return tf.data.Dataset.from_generator(
        lambda: ({"inputs": d} for d in docs),
        output_signature={"inputs": tf.TensorSpec([None], tf.int32)})


def _spanbert(n=800, length=2048, seed=1, **kwargs):
    with seqio.map_seed_manager(seed):
        ds = objectives.span_mlm(objectives.bert_single(_docs(n), FEATURES, {"inputs": length}),
                                 FEATURES, **kwargs)
    return list(ds.as_numpy_iterator())


def _runs(mask):
    """[(start, end)] (end inclusive) of the True runs of a bool row."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return list(zip(np.where(edges == 1)[0], np.where(edges == -1)[0] - 1))


@pytest.fixture(scope="module")
def examples():
    return _spanbert()


def test_span_masking_statistics(examples):
    """15% of the maskable tokens, whole words, clipped-geometric span lengths in words,
    80/10/10 per span, boundary features: the paper's recipe, checked over ~4,600 spans."""
    starts = VOCAB.word_starts()
    masked = maskable = 0
    lengths, treatment = [], {"mask": 0, "random": 0, "keep": 0}
    for e in examples:
        x, t, w = e["inputs"], e["targets"], e["loss_weights"].astype(bool)
        assert t[0] == SPECIAL["cls"] and t[-1] == SPECIAL["sep"] and not w[0] and not w[-1]
        np.testing.assert_array_equal(x[~w], t[~w])
        masked += w.sum()
        maskable += len(t) - 2
        for s, end in _runs(w):
            # a word is never split: the span starts at a word start (or the row's first
            # token) and the token after it starts a new word (or is [SEP])
            assert s == 1 or starts[t[s]], (s, t[s - 1:s + 2])
            assert end + 1 == len(t) - 1 or starts[t[end + 1]]
            lengths.append(int(sum(starts[t[i]] or i == 1 for i in range(s, end + 1))))
            # the boundary features: unmasked neighbours, offsets 1.. in the span
            np.testing.assert_array_equal(e["span_left"][s:end + 1], s - 1)
            np.testing.assert_array_equal(e["span_right"][s:end + 1], end + 1)
            np.testing.assert_array_equal(e["span_offset"][s:end + 1], np.arange(1, end - s + 2))
            # one treatment for the whole span
            if (x[s:end + 1] == SPECIAL["mask"]).all():
                treatment["mask"] += 1
            elif (x[s:end + 1] == t[s:end + 1]).all():
                treatment["keep"] += 1
            else:
                assert not (x[s:end + 1] == SPECIAL["mask"]).any()
                assert (x[s:end + 1] != t[s:end + 1]).mean() > 0.5  # random ids (1/897 equal)
                treatment["random"] += 1
        for k in ("span_left", "span_right", "span_offset"):
            assert (e[k][~w] == 0).all()
    # the budget is round(15%) per row; the last span may overshoot by less than one word
    assert 0.15 <= masked / maskable < 0.155, masked / maskable
    spans = sum(treatment.values())
    assert spans > 4000
    assert abs(treatment["mask"] / spans - 0.8) < 0.03
    assert abs(treatment["random"] / spans - 0.1) < 0.02
    assert abs(treatment["keep"] / spans - 0.1) < 0.02
    # span lengths in words: Geo(0.2) on 1..10 (renormalised, mean 3.8); only the last span of
    # each (2048-token) row is cut by the budget. Measured: 0.016 total variation from the
    # target; piling the tail onto 10 instead is 0.10 away, Geo(0.25) 0.066, Geo(0.3) 0.13.
    hist = np.bincount(lengths, minlength=11)[1:] / len(lengths)
    expected = objectives.span_length_probs(0.2, 10)
    assert len(hist) == 10 and abs(np.mean(lengths) - 3.8) < 0.15
    assert 0.5 * np.abs(hist - expected).sum() < 0.035, (hist, expected)


def test_span_masking_same_seed_same_data_and_parameters():
    a, b, c = _spanbert(20, 128, seed=3), _spanbert(20, 128, seed=3), _spanbert(20, 128, seed=4)
    flat = lambda exs: np.concatenate([np.concatenate([e["inputs"], e["span_offset"]])  # noqa
                                       for e in exs])
    np.testing.assert_array_equal(flat(a), flat(b))
    assert not np.array_equal(flat(a), flat(c))
    # one-word spans (a geometric with p = 1) at 30%
    for e in _spanbert(40, 256, mask_rate=0.3, geometric_p=1.0):
        w = e["loss_weights"].astype(bool)
        assert abs(w.sum() / (len(w) - 2) - 0.3) < 0.02
        for s, end in _runs(w):
            assert sum(VOCAB.word_starts()[e["targets"][s:end + 1]]) <= 1


def test_word_starts_from_real_vocabularies(data_dir, tmp_path, monkeypatch):
    """SentencePiece: pieces beginning with "▁"; BERT WordPiece: entries without "##"."""
    from t5lite.tasks import vocabularies
    sp = vocabularies.get_vocabulary("t5lite_sp8k")  # the test data dir's 600-piece model
    text = "the quickest of his nouns were unaffable"
    ids = sp.encode(text)
    starts = objectives.word_starts(sp)
    assert starts.shape == (sp.vocab_size,) and starts[sp.vocab_size - 1]  # sentinels: words
    assert sum(starts[i] for i in ids) == len(text.split()) < len(ids)
    words = [["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]",
                                                                 "[MASK]"],
             ["un", "##aff", "##able", "play", "##ing", "cat"]]
    (tmp_path / "vocab" / "bert").mkdir(parents=True)
    (tmp_path / "vocab" / "bert" / "vocab.txt").write_text("\n".join(sum(words, [])) + "\n")
    monkeypatch.setenv("T5LITE_DATA_DIR", str(tmp_path))
    bert = vocabularies.BertVocabulary()
    ids = bert.encode("unaffable playing cat")
    assert ids == [104, 105, 106, 107, 108, 109]
    assert [bool(objectives.word_starts(bert)[i]) for i in ids] == [True, False, False, True,
                                                                     False, True]


def _check_boundaries(b):
    """Every masked token's boundaries index its row, lie in its segment and are unmasked."""
    checked = 0
    seg_BL = b.get("encoder_segment_ids", np.ones_like(b["encoder_input_tokens"]))
    for i in range(len(seg_BL)):
        w, seg = b["encoder_loss_weights"][i] > 0, seg_BL[i]
        left, right = b["encoder_span_left"][i], b["encoder_span_right"][i]
        offset = b["encoder_span_offset"][i]
        for j in np.where(w)[0]:
            assert left[j] < j < right[j] and j - offset[j] == left[j]
            assert not w[left[j]] and not w[right[j]] and w[left[j] + 1:right[j]].all()
            assert seg[left[j]] == seg[j] == seg[right[j]] > 0
            checked += 1
        assert (offset[~w] == 0).all() and (left[~w] == 0).all() and (right[~w] == 0).all()
    return checked


def test_converter_packs_span_features():
    """Packed rows hold several examples: the converter moves each example's boundary
    positions to the row's coordinates (example start = i - encoder_positions[i])."""
    from t5lite.tasks import converters, registry
    features = list(registry.bert_features(VOCAB, spans=True))
    with seqio.map_seed_manager(0):
        ds = objectives.span_mlm(registry.bert_wrap(_docs(60).map(
            lambda x: {"inputs": x["inputs"][:50]}), FEATURES, {"inputs": 64}), FEATURES)
        conv = converters.make_converter("encoder_only", features, pack=True)
        rows = list(conv(ds, conv.task_lengths(64)).batch(8).as_numpy_iterator())
    assert sum(_check_boundaries(b) for b in rows) > 300
    assert max(b["encoder_segment_ids"].max() for b in rows) > 1


def test_corpus_spanbert_task(data_dir):
    """The registered task through the pipeline (unpacked rows): SBO features, no NSP."""
    from t5lite.tasks import pipeline
    ds = pipeline.get_dataset("corpus_spanbert", {"inputs": 48}, "encoder_only", 8,
                              split="validation", shuffle=False, seed=0, pack=False,
                              num_epochs=1, drop_remainder=False)
    checked = 0
    for b in ds.as_numpy_iterator():
        assert "nsp_labels" not in b and "encoder_token_type_ids" not in b  # no NSP
        checked += _check_boundaries(b)
    assert checked > 500


def _tiny_spanbert_cfg():
    import train_helpers
    cfg = train_helpers.tiny_config("encoder_only", batch_size=8, length=32, lr=3e-3)
    m = cfg.model
    m.sbo_head, m.sbo_max_span_length, m.init_std = True, 8, 0.02
    m.norm, m.pre_norm, m.ffn, m.use_bias, m.embed_norm = "layernorm", False, "gelu", True, True
    return cfg


def test_sbo_head_shapes_params_and_loss():
    import jax
    from flax.linen import meta
    from t5lite.models import build_model, count_params, dummy_batch
    from t5lite.train import losses

    cfg = _tiny_spanbert_cfg()
    model = build_model(cfg.model)
    batch = dummy_batch(cfg.model, 2, {"inputs": 32})
    params = meta.unbox(jax.jit(model.init)({"params": jax.random.key(0)}, batch)["params"])
    shapes = jax.tree.map(lambda x: x.shape, params["sbo"])
    assert shapes["dense_0"]["kernel"] == (96, 32) and shapes["dense_1"]["kernel"] == (32, 32)
    assert shapes["position_embedder"]["embedding"] == (9, 32)
    assert count_params(cfg.model) - count_params(cfg.model, heads=False) > 96 * 32  # a head

    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 120, (2, 32)).astype(np.int32)
    w = np.zeros((2, 32), np.int32)
    w[:, 5:8] = 1  # one span 5..7: boundaries 4 and 8
    batch = {"encoder_input_tokens": tokens, "encoder_target_tokens": tokens,
             "encoder_loss_weights": w, "encoder_span_left": 4 * w, "encoder_span_right": 8 * w,
             "encoder_span_offset": w * (np.arange(32) - 4)}
    apply = jax.jit(lambda b: model.apply({"params": params}, b))  # one compile per key set
    out = apply(batch)
    assert out["sbo_logits"].shape == out["logits"].shape == (2, 32, 128)
    no_spans = {k: v for k, v in batch.items() if "span" not in k}
    assert "sbo_logits" not in apply(no_spans)
    # its own head (not the MLM logits), reading the boundaries and the offset
    base = np.asarray(out["sbo_logits"][:, 5:8])
    assert not np.allclose(base, out["logits"][:, 5:8])
    for change in (dict(encoder_span_left=3 * w), dict(encoder_span_right=9 * w),
                   dict(encoder_span_offset=w * (np.arange(32) - 3))):
        changed = apply(dict(batch, **change))
        assert not np.allclose(base, changed["sbo_logits"][:, 5:8])
        np.testing.assert_array_equal(out["logits"], changed["logits"])
    loss, metrics = jax.jit(lambda o, b: losses.compute_loss(cfg, o, b))(out, batch)
    np.testing.assert_allclose(loss, metrics["mlm_loss"] + metrics["sbo_loss"], rtol=1e-6)
    assert metrics["sbo_loss"] > 1.0 and "sbo_accuracy" in metrics


def test_sbo_loss_falls_in_training(tmp_path):
    """A few steps of trainer.train on span-masked batches: the SBO loss is wired into the
    gradient (it falls with the MLM loss)."""
    import json
    from t5lite.train import trainer

    cfg = _tiny_spanbert_cfg()
    cfg.train.steps, cfg.train.log_every, cfg.train.eval_steps = 80, 10, 0
    cfg.optim.learning_rate = 1e-2
    cfg.data.feature_lengths = {"inputs": 32}
    rng = np.random.default_rng(0)

    def batches():  # a learnable stream: repeating counting sequences, span-masked
        cols = np.arange(32)
        while True:
            start = rng.integers(3, 100, (8, 1))
            t = (3 + (start + cols) % 100).astype(np.int32)
            t[:, 0], t[:, -1] = 126, 125
            w = np.zeros((8, 32), np.int32)
            left = np.zeros_like(w)
            for r in range(8):
                s = rng.integers(1, 27)
                w[r, s:s + 3] = 1
                left[r] = s - 1
            yield {"encoder_input_tokens": np.where(w > 0, 127, t).astype(np.int32),
                   "encoder_target_tokens": t, "encoder_loss_weights": w,
                   "encoder_span_left": left * w, "encoder_span_right": (left + 4) * w,
                   "encoder_span_offset": w * (cols[None] - left)}
    trainer.train(cfg, str(tmp_path), train_iter=batches())
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    train = [r for r in rows if "sbo_loss" in r and r.get("split") == "train"]
    # measured: SBO 4.75 -> 2.26 while the MLM went 4.75 -> 4.47 (the SBO head learns the
    # offset-from-the-left-boundary rule through its own gradient)
    first, last = train[0], train[-1]
    assert len(train) >= 4 and last["sbo_loss"] < 0.6 * first["sbo_loss"]
    assert last["loss"] == pytest.approx(last["mlm_loss"] + last["sbo_loss"], rel=1e-5)


@pytest.mark.parametrize("task", ["corpus_spanbert", "corpus_mlm_only"])
def test_masks_drawn_again_every_epoch(data_dir, task):
    """Dynamic masking (RoBERTa's; SpanBERT's too): the second epoch masks the same text anew.
    Compared token by token on the text stream, since the epochs' row boundaries differ (the
    first epoch's last row continues into the second), which alone makes every row differ."""
    from t5lite.tasks import pipeline

    def stream(epochs):
        ds = pipeline.get_dataset(task, {"inputs": 32}, "encoder_only", 8, split="validation",
                                  shuffle=False, seed=0, pack=False, num_epochs=epochs,
                                  drop_remainder=False)
        tokens, weights = [], []
        for b in ds.as_numpy_iterator():
            for t, w in zip(b["encoder_target_tokens"], b["encoder_loss_weights"]):
                n = int((t != 0).sum())  # [CLS] text [SEP], then padding
                tokens.extend(t[1:n - 1])
                weights.extend(w[1:n - 1])
        return np.array(tokens), np.array(weights, bool)
    t1, w1 = stream(1)
    t2, w2 = stream(2)
    n = len(t1)
    np.testing.assert_array_equal(t2[n:2 * n], t1)  # the same text again ...
    np.testing.assert_array_equal(w2[:n - 32], w1[:n - 32])  # (the same seed: same 1st epoch)
    masked = w1.sum()
    assert masked > 500 and abs(w2[n:2 * n].sum() / masked - 1) < 0.1
    # ... masked anew: independent masks share ~15% of the masked tokens; static masks 100%
    assert (w1 & w2[n:2 * n]).sum() < 0.4 * masked


def test_roberta_recipe_no_nsp_full_rows_of_contiguous_text(data_dir):
    """RoBERTa's data recipe on its preset task: no NSP (no pair, token types or labels), rows
    of contiguous text that cross paragraph lines and fill the row ("full sentences"), packed;
    dynamic masking is test_roberta.py's test_mlm_data_is_drawn_again_every_epoch."""
    from t5lite.models.presets import roberta
    from t5lite.tasks import pipeline, vocabularies
    cfg = roberta("tiny")
    assert not cfg.model.nsp_head and cfg.model.num_token_types == 1 and cfg.data.pack
    length = 40
    ds = pipeline.get_dataset(cfg.data.mixture_or_task, {"inputs": length}, "encoder_only", 4,
                              split="validation", shuffle=False, seed=0, pack=cfg.data.pack,
                              num_epochs=1, drop_remainder=False)
    special = objectives.bert_special_ids(vocabularies.get_vocabulary("t5lite_sp8k"))
    stream, full = [], 0
    batches = list(ds.as_numpy_iterator())
    for b in batches:
        assert set(b) == {"encoder_input_tokens", "encoder_target_tokens",
                          "encoder_loss_weights", "encoder_segment_ids", "encoder_positions"}
        for t, seg in zip(b["encoder_target_tokens"], b["encoder_segment_ids"]):
            full += seg.min() > 0  # no padding: the row is filled
            for s in range(1, seg.max() + 1):
                ex = t[seg == s]
                assert ex[0] == special["cls"] and ex[-1] == special["sep"]
                stream.extend(ex[1:-1])
    rows = sum(len(b["encoder_target_tokens"]) for b in batches)
    assert full > 0.9 * rows
    # contiguous: the rows' text, in order, is the split's token stream
    vocab = vocabularies.get_vocabulary("t5lite_sp8k")
    with open(f"{data_dir}/corpus/validation.txt", encoding="utf-8") as f:
        tokens = np.concatenate([vocab.encode(line.rstrip("\n")) for line in f])
    np.testing.assert_array_equal(stream, tokens)


def test_tiny_spanbert_config_and_sbo_head_checks():
    from t5lite.config import load_config
    from t5lite.errors import UserError
    from t5lite.models import build_model
    cfg = load_config("configs/tiny_spanbert.py")
    m = cfg.model
    assert m.sbo_head and not m.nsp_head and m.architecture == "encoder_only"
    assert (cfg.data.mixture_or_task, cfg.data.pack) == ("corpus_spanbert", True)
    for bad in (dict(architecture="decoder_only"), dict(sbo_max_span_length=0)):
        with pytest.raises(UserError, match="sbo_head"):
            build_model(dataclasses.replace(m, **bad))
