"""BART's noising functions (t5lite/tasks/objectives/bart.py, bart_denoising; Lewis et al. 2019,
Section 2.2): each noise's statistics and exact semantics on distinct token ids (so every
output token can be traced to its origin), the corpus_bart_* tasks on the test data dir, and
the table4_bart ablation rows."""

import math
import os

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5lite import ablations
from t5lite.ablations import files as ablation_files
from t5lite.errors import UserError
from t5lite.tasks import objectives

VOCAB = seqio.PassThroughVocabulary(size=1000)
MASK = objectives.bart_mask_id(VOCAB)  # no mask_id: <extra_id_0> = vocab_size - 1
FIRST = 10  # ordinary ids start here: FIRST + position, never the mask


def _tokens(n):
    return tf.range(FIRST, FIRST + n, dtype=tf.int32)


def _seeds(i, k=2):
    return tf.constant([[i, 7 * j + 1] for j in range(k)], tf.int64)


def _infilling_spans(out, n):
    """Trace infilling's output on _tokens(n) back to its spans: [(start, length)], in order.
    Asserts the layout: kept tokens in order, and a span is one mask token (never two in a
    row)."""
    spans, prev = [], FIRST - 1  # the original id just before the current position
    pending = None
    for t in list(out) + [FIRST + n]:  # a sentinel "kept" token after the end
        if t == MASK:
            assert pending is None, "two masks in a row: a span must be one mask token"
            pending = prev + 1 - FIRST
            continue
        assert t > prev, "kept tokens must stay in order"
        if pending is not None:
            spans.append((pending, t - prev - 1))
            pending = None
        else:
            assert t == prev + 1, "tokens vanished without a mask in their place"
        prev = t
    return spans


def test_text_infilling_spans_follow_poisson3():
    """Span lengths (0 included) over many chunks ~ Poisson(3): chi-square over bins
    0..8, 9+; mean and variance both ~3 (a geometric or fixed length fails one of them)."""
    n, lengths = 400, []
    infill = tf.function(lambda seeds: objectives.text_infilling(_tokens(n), seeds, VOCAB))
    for i in range(120):
        out = infill(_seeds(i)).numpy()
        lengths += [length for _, length in _infilling_spans(out, n)]
    lengths = np.array(lengths)
    assert len(lengths) > 4000
    assert abs(lengths.mean() - 3.0) < 0.15 and abs(lengths.var() - 3.0) < 0.4
    probs = [math.exp(-3) * 3 ** k / math.factorial(k) for k in range(9)]
    probs.append(1 - sum(probs))
    observed = [np.sum(lengths == k) for k in range(9)] + [np.sum(lengths >= 9)]
    expected = np.array(probs) * len(lengths)
    chi2 = float(np.sum((np.array(observed) - expected) ** 2 / expected))
    assert chi2 < 27.9, (chi2, observed)  # 9 degrees of freedom, p = 0.001
    assert observed[0] > 0  # zero-length spans happen (~5%) ...


def test_text_infilling_masks_the_rate_one_mask_per_span_and_inserts():
    inserts = 0
    for i, (n, rate) in enumerate([(400, 0.3), (137, 0.3), (90, 0.15), (61, 0.5), (5, 0.3),
                                   (2, 0.3)] * 6):
        out = objectives.text_infilling(_tokens(n), _seeds(i), VOCAB, rate=rate).numpy()
        spans = _infilling_spans(out, n)  # asserts one mask per span, order kept
        masked = sum(length for _, length in spans)
        assert masked == min(round(n * rate), n - 1)  # exactly the rate (rounded)
        assert int(np.sum(out == MASK)) == len(spans)
        assert len(out) <= n  # never longer than the chunk (fits inputs_length with EOS)
        # ... and a zero-length span is a mask inserted between two adjacent tokens
        inserts += sum(1 for _, length in spans if length == 0)
        has_span, span_len = objectives.infilling_plan(n, rate, _seeds(i))
        assert sorted(np.asarray(span_len)[np.asarray(has_span)].tolist()) == sorted(
            length for _, length in spans)
    assert inserts > 0
    # masked fraction over many chunks ~ the rate
    n = 200
    fractions = [sum(length for _, length in _infilling_spans(objectives.text_infilling(
        _tokens(n), _seeds(i), VOCAB, rate=0.3).numpy(), n)) / n for i in range(20)]
    assert abs(np.mean(fractions) - 0.3) < 0.01


def test_text_infilling_seeded_and_uses_the_vocabulary_mask():
    a = objectives.text_infilling(_tokens(100), _seeds(3), VOCAB).numpy()
    assert np.array_equal(a, objectives.text_infilling(_tokens(100), _seeds(3), VOCAB).numpy())
    assert not np.array_equal(a, objectives.text_infilling(_tokens(100), _seeds(4), VOCAB)
                              .numpy())

    class WithMask(seqio.PassThroughVocabulary):
        mask_id = 5

    out = objectives.text_infilling(_tokens(100), _seeds(3), WithMask(size=1000)).numpy()
    assert np.array_equal(np.where(a == MASK, 5, a), out)
    with pytest.raises(UserError, match=r"\(0, 0.5\]"):
        objectives.text_infilling(_tokens(100), _seeds(3), VOCAB, rate=0.7)


def _sentences(tokens, final_ids):
    out, cur = [], []
    for i, t in enumerate(tokens):
        cur.append(int(t))
        if t in final_ids and (i + 1 == len(tokens) or tokens[i + 1] not in final_ids):
            out.append(tuple(cur))
            cur = []
    return out + ([tuple(cur)] if cur else [])


def test_sentence_permutation_permutes_whole_sentences():
    final = (3, 4)  # e.g. "." and "!"
    rng = np.random.default_rng(0)
    sents = [list(FIRST + 100 * s + np.arange(rng.integers(1, 8))) + [int(rng.choice(final))]
             for s in range(7)]
    sents[2] += [4]  # a run of final pieces ends one sentence ("?!")
    tokens = np.array(sum(sents, []) + [FIRST + 900, FIRST + 901], np.int32)  # cut: no stop
    want = sorted(_sentences(tokens, final))
    assert len(want) == 8
    orders = set()
    for i in range(20):
        out = objectives.sentence_permutation(tf.constant(tokens), _seeds(i), VOCAB,
                                              final_ids=final).numpy()
        assert sorted(out.tolist()) == sorted(tokens.tolist())  # tokens unchanged
        got = [tuple(s) for s in _split_as(out, want)]
        assert sorted(got) == want  # a permutation of the sentences
        orders.add(tuple(got))
        again = objectives.sentence_permutation(tf.constant(tokens), _seeds(i), VOCAB,
                                                final_ids=final).numpy()
        assert np.array_equal(out, again)  # seeded
    assert len(orders) > 10  # the order changes with the seed


def _split_as(out, sentences):
    """Cut ``out`` into the known sentences (each starts with a unique id), failing if a
    sentence is not contiguous."""
    by_start = {s[0]: s for s in sentences}
    pieces, i = [], 0
    while i < len(out):
        s = by_start[int(out[i])]
        assert tuple(out[i:i + len(s)].tolist()) == s, "a sentence was broken up"
        pieces.append(s)
        i += len(s)
    return pieces


def test_sentence_final_ids_of_a_real_vocabulary(data_dir):
    from t5lite.tasks import vocabularies
    vocab = vocabularies.get_vocabulary("t5lite_sp8k")
    ids = objectives.sentence_final_ids(vocab)
    assert ids and all(vocab.decode([i]).rstrip()[-1] in ".!?" for i in ids)
    (stop,) = [t for t in vocab.encode("Words end here.") if vocab.decode([t]).endswith(".")]
    assert stop in ids
    assert not any(vocab.decode([i]).rstrip().rstrip(".").isdigit() for i in ids)


def test_token_deletion_removes_exactly_the_chosen_tokens_in_order():
    n, rate = 150, 0.3
    counts = np.zeros(n)
    delete = tf.function(lambda seeds: objectives.token_deletion(_tokens(n), seeds, VOCAB))
    for i in range(200):
        out = delete(_seeds(i)).numpy()
        assert len(out) == n - round(n * rate)
        assert np.all(np.diff(out) > 0)  # order kept, nothing added or repeated
        gone = np.setdiff1d(np.arange(FIRST, FIRST + n), out) - FIRST
        chosen = objectives.bart._exact_count_mask(n, round(n * rate), _seeds(i)[0]).numpy()
        assert np.array_equal(gone, np.flatnonzero(chosen))  # exactly the chosen ones
        counts[gone] += 1
    # every position is as likely to go: ~rate each (binomial sd ~0.032 over 200 draws)
    assert abs(counts.mean() / 200 - rate) < 1e-9 and np.all(np.abs(counts / 200 - rate) < 0.15)


def test_token_masking_masks_the_rate_and_keeps_the_rest():
    n = 120
    out = objectives.token_masking(_tokens(n), _seeds(0), VOCAB, rate=0.3).numpy()
    assert int(np.sum(out == MASK)) == round(n * 0.3)
    keep = out != MASK
    assert np.array_equal(out[keep], np.arange(FIRST, FIRST + n)[keep])


def test_document_rotation_is_a_rotation_at_a_uniform_token():
    n = 10
    starts = []
    for i in range(400):
        out = objectives.document_rotation(_tokens(n), _seeds(i)).numpy()
        k = int(out[0]) - FIRST
        assert np.array_equal(out, np.concatenate([np.arange(FIRST + k, FIRST + n),
                                                   np.arange(FIRST, FIRST + k)]))
        starts.append(k)
    counts = np.bincount(starts, minlength=n)
    assert len(counts) == n and counts.min() > 15  # every token can start it (~40 each)


# ----------------------------------------------------------------------------- tasks


BART_TASKS = ("corpus_bart_infilling", "corpus_bart_permutation", "corpus_bart_deletion",
              "corpus_bart_rotation", "corpus_bart_masking", "corpus_bart_infilling_permutation")


def _examples(task, lengths, seed=0, n=6):
    ds = seqio.get_mixture_or_task(task).get_dataset(lengths, split="validation",
                                                     shuffle=False, seed=seed)
    return [{k: v.numpy() for k, v in ex.items()} for ex in ds.take(n)]


def test_tasks_targets_are_the_original_text_and_inputs_fit(data_dir):
    """Targets: the corpus stream cut into L - 1 tokens + EOS, identical for every noise;
    inputs within the feature length, EOS-terminated, and the noise of their targets."""
    from t5lite.tasks import vocabularies
    vocab = vocabularies.get_vocabulary("t5lite_sp8k")
    lengths = {"inputs": 48, "targets": 48}
    with open(os.path.join(data_dir, "corpus", "validation.txt")) as f:
        stream = sum((vocab.encode(line.rstrip("\n")) for line in f), [])
    first, built = None, {}
    for task in BART_TASKS:
        exs = built[task] = _examples(task, lengths)
        targets = np.concatenate([ex["targets"][:-1] for ex in exs])
        assert all(ex["targets"][-1] == 1 and len(ex["targets"]) == 48 for ex in exs)
        assert targets.tolist() == stream[:len(targets)]
        first = targets if first is None else first
        assert np.array_equal(targets, first)
        for ex in exs:
            inputs, tgt = ex["inputs"][:-1], ex["targets"][:-1]
            assert ex["inputs"][-1] == 1 and len(ex["inputs"]) <= 48
            mask = vocab.vocab_size - 1
            if task in ("corpus_bart_permutation", "corpus_bart_rotation"):
                assert sorted(inputs.tolist()) == sorted(tgt.tolist())
            if task == "corpus_bart_rotation":
                assert any(np.array_equal(inputs, np.roll(tgt, -s)) for s in range(len(tgt)))
            if task == "corpus_bart_deletion":
                assert len(inputs) == len(tgt) - round(len(tgt) * 0.3)
                it = iter(tgt.tolist())
                assert all(t in it for t in inputs.tolist())  # a subsequence
            if task == "corpus_bart_masking":
                assert int(np.sum(inputs == mask)) == round(len(tgt) * 0.3)
            if task == "corpus_bart_infilling":
                it = iter(tgt.tolist())
                assert all(t in it for t in inputs[inputs != mask].tolist())
                kept = int(np.sum(inputs != mask))
                assert len(tgt) - kept == round(len(tgt) * 0.3)
    moved = [not np.array_equal(ex["inputs"], ex["targets"])
             for ex in built["corpus_bart_permutation"]]
    assert sum(moved) >= len(moved) // 2  # the test corpus has 1-6 sentences per line
    # seeded: the same seed gives the same inputs, another seed others
    a, b = built["corpus_bart_infilling_permutation"], _examples(
        "corpus_bart_infilling_permutation", lengths, seed=0)
    c = _examples("corpus_bart_infilling_permutation", lengths, seed=1)
    assert all(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, b))
    assert not all(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, c))


def test_chunks_from_the_stream_or_inside_documents():
    docs = [list(range(FIRST, FIRST + 5)), list(range(FIRST + 100, FIRST + 112))]
    ds = tf.data.Dataset.from_generator(lambda: ({"targets": d} for d in docs),
                                        output_signature={"targets": tf.TensorSpec([None],
                                                                                   tf.int32)})
    features = {"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)}
    for split, want in (("stream", [docs[0] + docs[1][:2], docs[1][2:9], docs[1][9:]]),
                        ("documents", [docs[0], docs[1][:7], docs[1][7:]])):
        out = list(objectives.bart_denoising(ds, features, {"inputs": 8, "targets": 8},
                                             noises=("rotation",), split=split)
                   .as_numpy_iterator())
        assert [ex["targets"].tolist() for ex in out] == want  # inputs length - 1 each
        for ex in out:
            assert sorted(ex["inputs"].tolist()) == sorted(ex["targets"].tolist())


def test_unknown_noise_is_a_user_error():
    with pytest.raises(UserError, match="unknown BART noise"):
        objectives.bart_denoising(tf.data.Dataset.range(1), {"targets": seqio.Feature(VOCAB)},
                                  noises=("shuffle",))


# ----------------------------------------------------------------------------- ablation rows


def test_table4_bart_rows_and_paper_cells(tmp_path, capsys):
    table = ablations.load_table("table4_bart")
    names = [r.name for r in table.rows]
    assert names[0] == table.baseline == "t5_baseline"
    assert table.row("t5_baseline").paper == ablations.PAPER_BASELINE
    for name in names[1:]:
        assert table.row(name).paper is None
        pre, (ft,) = ablations.plan_row(table, table.row(name), "/w", ("sentiment",))
        assert pre.cfg.data.mixture_or_task == f"corpus_{name}"
        assert pre.cfg.data.feature_lengths == {"inputs": 128, "targets": 128}
        assert ft.cfg.checkpoint.init_from == pre.workdir
    lines = ablations.render(table, str(tmp_path)).splitlines()
    (base,) = [ln for ln in lines if ln.startswith("| ★ T5 baseline")]
    assert "83.28" in base
    ablations.run("table4_bart", str(tmp_path), dry_run=True)
    out = capsys.readouterr().out
    for name in names:
        assert f"# table4_bart / {name}:" in out
    # rows not run and without paper numbers are not rendered; once run, "–" in paper cells
    result = {"metrics": {"sentiment/accuracy": 55.0}, "runs": {}, "scale": "tiny"}
    os.makedirs(tmp_path / "table4_bart" / "bart_infilling")
    ablation_files.write_json(str(tmp_path / "table4_bart" / "bart_infilling" / "result.json"),
                          result)
    lines = ablations.render(table, str(tmp_path)).splitlines()
    (row,) = [ln for ln in lines if ln.startswith("| BART text infilling (30%")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].strip("*") == "55.00" and cells[2:] == ["–"] * 7
    # at --scale paper the rows read C4 (c4_bart_*, registered with the t5 vocabulary)
    pre, _ = ablations.plan_row(table, table.row("bart_rotation"), "/w", ("glue",), "paper")
    assert pre.cfg.data.mixture_or_task == "c4_bart_rotation"
    import t5lite.tasks  # noqa: F401
    assert "c4_bart_rotation" in seqio.TaskRegistry.names()


@pytest.mark.slow
def test_table4_bart_row_runs(data_dir, tmp_path, monkeypatch):
    """One BART row end to end at a test scale (a few steps of a small model: ~1 min)."""
    monkeypatch.setitem(ablations.SCALES, "test", ablations.Scale(
        pretrain=("train.steps=3", "checkpoint.every_steps=3", "train.eval_steps=0",
                  "data.batch_size=8", "data.feature_lengths={'inputs': 32, 'targets': 16}"),
        finetune=("train.steps=2", "checkpoint.every_steps=2", "eval.every_steps=2",
                  "train.eval_steps=0", "data.batch_size=8", "eval.max_examples=8")))
    small = ["model.d_model=32", "model.num_heads=2", "model.head_dim=16", "model.d_ff=64",
             "model.num_encoder_layers=1", "model.num_decoder_layers=1",
             "model.vocab_size=768", "train.prepare_data=()", "train.log_every=1"]
    (result,) = ablations.run("table4_bart", str(tmp_path), rows=["bart_infilling_permutation"],
                              scale="test", overrides=small).values()
    assert 0.0 <= result["metrics"]["sentiment/accuracy"] <= 100.0
    import json
    with open(tmp_path / "table4_bart" / "bart_infilling_permutation" / "pretrain" /
              "config.json") as f:
        cfg = json.load(f)
    assert cfg["data"]["mixture_or_task"] == "corpus_bart_infilling_permutation"
    assert cfg["data"]["feature_lengths"] == {"inputs": 32, "targets": 32}
