"""The T5 paper's objectives: statistics, sentinels, exact reconstruction, determinism."""

import functools
import itertools

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5lite.tasks import objectives
from t5lite.tasks.objectives import t5 as t5_objectives

VOCAB_SIZE = 1000  # sentinels are 999, 998, ...; ordinary tokens below 900


class _Vocab(seqio.PassThroughVocabulary):
    """Integer tokens with T5's layout: pad 0, eos 1, unk 2, 100 sentinels at the top."""

    def __init__(self):
        super().__init__(size=VOCAB_SIZE - 100, eos_id=1)
        self._extra_ids = 100

    @property
    def unk_id(self):
        return 2


VOCAB = _Vocab()
FEATURES = {"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)}


def _docs(n=400, seed=0, key="targets"):
    rng = np.random.RandomState(seed)
    docs = [rng.randint(3, 900, size=rng.randint(20, 400)).astype(np.int32) for _ in range(n)]
    return tf.data.Dataset.from_generator(
        lambda: ({key: d} for d in docs), output_signature={key: tf.TensorSpec([None], tf.int32)})


def _run(fn, seed=0, n=400, key="targets", **kwargs):
    with seqio.map_seed_manager(seed):
        ds = fn(_docs(n, key=key), FEATURES, **kwargs)
    return list(ds.as_numpy_iterator())


def _merge(inputs, targets):
    """Undo span corruption: put each sentinel's target span back into the inputs."""
    spans, cur = {}, None
    for t in targets:
        if t >= VOCAB_SIZE - 100:
            cur = spans.setdefault(int(t), [])
        else:
            cur.append(int(t))
    out = []
    for t in inputs:
        out.extend(spans[int(t)] if t >= VOCAB_SIZE - 100 else [int(t)])
    return out


def test_random_spans_helper_paper_numbers():
    assert objectives.random_spans_helper(512, 0.15, 3.0) == (568, 114)
    tokens, targets = objectives.random_spans_helper(128, 0.15, 3.0)
    assert (tokens, targets) == (141, 29)  # 120 kept + 7 sentinels + EOS = 128
    # The helper's lengths are what the objective really produces (+1 EOS each).
    for density, span in ((0.15, 3.0), (0.5, 10.0), (0.25, 2.0)):
        tokens, targets = objectives.random_spans_helper(512, density, span)
        exs = _run(functools.partial(objectives.span_corruption, noise_density=density,
                                     mean_noise_span_length=span),
                   sequence_length={"inputs": 512, "targets": targets}, n=60)
        full = [e for e in exs if len(_merge(e["inputs"], e["targets"])) == tokens]
        assert full
        assert max(len(e["inputs"]) for e in full) + 1 == 512
        assert max(len(e["targets"]) for e in full) + 1 == targets


@pytest.mark.parametrize("density,span", [(0.15, 3.0), (0.5, 10.0), (0.25, 2.0)])  # <= 100 spans
def test_span_corruption_statistics_and_reconstruction(density, span):
    exs = _run(functools.partial(objectives.span_corruption, noise_density=density,
                                 mean_noise_span_length=span),
               sequence_length={"inputs": 512, "targets": 512}, n=500)
    originals = [e["targets"] for e in _run(
        lambda ds, of: objectives.concat_and_split(
            ds, objectives.random_spans_helper(512, density, span)[0]), n=500)]
    assert len(exs) == len(originals) > 100
    noise = total = spans = 0
    for ex, orig in zip(exs, originals):
        # Exact reconstruction of the original chunk.
        np.testing.assert_array_equal(_merge(ex["inputs"], ex["targets"]), orig)
        sentinels_in = [t for t in ex["inputs"] if t >= VOCAB_SIZE - 100]
        sentinels_tgt = [t for t in ex["targets"] if t >= VOCAB_SIZE - 100]
        # Sentinels count down from the end of the vocabulary, in the same order.
        assert sentinels_in == list(range(VOCAB_SIZE - 1, VOCAB_SIZE - 1 - len(sentinels_in), -1))
        assert sentinels_tgt == sentinels_in
        assert ex["inputs"][0] < VOCAB_SIZE - 100  # spans start with non-noise
        noise += len(ex["targets"]) - len(sentinels_tgt)
        total += len(orig)
        spans += len(sentinels_tgt)
    assert abs(noise / total - density) <= 0.01 * density
    assert abs(noise / spans - span) <= 0.05 * span


def _t5_random_spans_noise_mask(length, noise_density, seeds, mean_noise_span_length):
    """The reference: T5's random_spans_noise_mask (t5/data/preprocessors.py in t5 0.9.4,
    random_roll=False) transcribed op for op, float32 counts and segment_sum included. t5 is
    not installable here (mesh-tensorflow, gin) and seqio 0.0.20 has no noise masks."""
    if noise_density == 0.0:
        return tf.zeros(length, tf.bool)
    orig_length, length = length, tf.maximum(length, 2)
    num_noise = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
    num_noise = tf.minimum(tf.maximum(num_noise, 1), length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length),
                        tf.int32)
    num_spans = tf.maximum(num_spans, 1)

    def segmentation(num_items, num_segments, seed):
        first = tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32)
        segment_id = tf.cumsum(tf.pad(seqio.stateless_shuffle(first, seed), [[1, 0]]))
        return tf.math.segment_sum(tf.ones_like(segment_id), segment_id)

    noise = segmentation(num_noise, num_spans, seeds[0])
    nonnoise = segmentation(length - num_noise, num_spans, seeds[1])
    interleaved = tf.reshape(tf.stack([nonnoise, noise], axis=1), [num_spans * 2])
    starts = tf.cumsum(interleaved)[:-1]
    indicator = tf.math.unsorted_segment_sum(tf.ones_like(starts), starts, length)
    return tf.equal(tf.cumsum(indicator) % 2, 1)[:orig_length]


def test_random_spans_noise_mask_is_t5s_bit_for_bit():
    """Same (length, density, mean span, seeds) -> the same mask bits as T5, also where T5's
    float32 count differs from float64's round(length * density) (190 at 0.15: 29, not 28)."""
    flips = [(190, 0.15, 3.0), (350, 0.15, 3.0), (90, 0.35, 2.0), (170, 0.35, 5.0),
             (95, 0.3, 3.0), (175, 0.3, 8.0)]
    for length, density, _ in flips:
        assert int(round(length * density)) + 1 == int(np.rint(np.float32(length) * density))
    rng = np.random.RandomState(0)
    # density <= 0.45 keeps non-noise tokens >= spans, where T5's segment_sum is defined
    settings = flips + [(0, 0.15, 3.0), (1, 0.5, 2.0), (2, 0.15, 3.0), (40, 0.0, 3.0)] + [
        (int(rng.randint(2, 700)), float(rng.choice([rng.uniform(0.01, 0.45), 0.1, 0.15, 0.25])),
         float(rng.choice([rng.uniform(1.0, 12.0), rng.randint(1, 11)]))) for _ in range(110)]
    for length, density, span in settings:
        seeds = [tf.constant(rng.randint(-2**31, 2**31 - 1, size=2), tf.int32) for _ in range(2)]
        ours = objectives.random_spans_noise_mask(length, density, seeds, span).numpy()
        reference = _t5_random_spans_noise_mask(length, density, seeds, span).numpy()
        assert ours.shape == (length,), (length, density, span)
        np.testing.assert_array_equal(ours, reference, err_msg=str((length, density, span)))
        if length >= 2 and density > 0:
            assert (int(ours.sum()), _num_spans(ours)) == t5_objectives._mask_counts(
                length, density, span), (length, density, span)
    assert _counts(190, 0.15, 3.0) == (29, 10)


def test_iid_noise_fraction():
    exs = _run(objectives.iid_denoising, sequence_length={"inputs": 256, "targets": 256})
    noise = sum(int((e["targets"] < VOCAB_SIZE - 100).sum()) for e in exs)
    total = noise + sum(int((e["inputs"] < VOCAB_SIZE - 100).sum()) for e in exs)
    assert abs(noise / total - 0.15) < 0.01


def test_bert_style_is_the_papers_90_10():
    """Section 3.3.1 / T5's reference: 90% mask token, 10% random token, none kept (BERT's
    own 80/10/10 is bert_mlm)."""
    exs = _run(objectives.bert_style_denoising, sequence_length={"inputs": 512, "targets": 512},
               n=600)
    changed = masked = total = 0
    for e in exs:
        assert len(e["inputs"]) == len(e["targets"])  # target = the original text
        masked += int((e["inputs"] == VOCAB_SIZE - 1).sum())
        changed += int(((e["inputs"] != e["targets"]) & (e["inputs"] != VOCAB_SIZE - 1)).sum())
        total += len(e["inputs"])
    # masked = 0.9 * 0.15, random = 0.1 * 0.15 (1/897 of random picks equal the original).
    assert abs(masked / total - 0.135) < 0.005
    assert abs((masked + changed) / total - 0.15) < 0.005  # nothing selected is kept
    assert abs(changed / (masked + changed) - 0.1) < 0.02


def test_bert_mlm_80_10_10_and_loss_weights():
    of = {"inputs": seqio.Feature(VOCAB)}
    with seqio.map_seed_manager(1):
        ds = objectives.bert_mlm(objectives.bert_single(_docs(600, key="inputs"), of,
                                                        {"inputs": 512}), of)
    sel = mask = rand = keep = maskable = 0
    special = objectives.bert_special_ids(VOCAB)
    for e in ds.as_numpy_iterator():
        w = e["loss_weights"].astype(bool)
        assert e["inputs"][0] == special["cls"] and e["inputs"][-1] == special["sep"]
        assert not w[0] and not w[-1]  # never [CLS] / [SEP]
        np.testing.assert_array_equal(e["inputs"][~w], e["targets"][~w])
        maskable += len(w) - 2
        sel += w.sum()
        mask += (e["inputs"][w] == special["mask"]).sum()
        keep += (e["inputs"][w] == e["targets"][w]).sum()
        rand += ((e["inputs"][w] != special["mask"]) & (e["inputs"][w] != e["targets"][w])).sum()
    assert abs(sel / maskable - 0.15) < 0.005
    assert abs(mask / sel - 0.8) < 0.02
    assert abs(rand / sel - 0.1) < 0.02
    assert abs(keep / sel - 0.1) < 0.02


def test_bert_pairs_nsp():
    of = {"inputs": seqio.Feature(VOCAB)}
    with seqio.map_seed_manager(0):
        exs = list(objectives.bert_pairs(_docs(300, key="inputs"), of, {"inputs": 128})
                   .as_numpy_iterator())
    special = objectives.bert_special_ids(VOCAB)
    labels = np.array([e["nsp_labels"] for e in exs])
    assert abs(labels.mean() - 0.5) < 0.07
    for e in exs:
        x, tt = e["inputs"], e["token_type_ids"]
        assert len(x) == len(tt) <= 128 and x[0] == special["cls"] and x[-1] == special["sep"]
        sep_a = list(x).index(special["sep"])
        assert (tt[:sep_a + 1] == 0).all() and (tt[sep_a + 1:] == 1).all()


@pytest.mark.parametrize("name", ["span_corruption", "iid_denoising", "drop_tokens",
                                  "bert_style_denoising", "mass_style_denoising", "deshuffling",
                                  "prefix_lm", "full_lm"])
def test_every_objective_runs_and_same_seed_same_data(name):
    fn = getattr(objectives, name)
    lengths = {"inputs": 64, "targets": 64}
    a, b = _run(fn, seed=3, n=30, sequence_length=lengths), _run(
        fn, seed=3, n=30, sequence_length=lengths)
    c = _run(fn, seed=4, n=30, sequence_length=lengths)
    assert a and all(len(e["targets"]) > 0 for e in a)
    flat = lambda exs: np.concatenate([np.concatenate(
        [[len(e.get("inputs", []))], e.get("inputs", []), e["targets"]]) for e in exs])
    np.testing.assert_array_equal(flat(a), flat(b))
    if name != "full_lm":  # the only deterministic one
        assert not np.array_equal(flat(a), flat(c))


def test_objective_specifics():
    lengths = {"inputs": 64, "targets": 64}
    drops = _run(objectives.drop_tokens, sequence_length=lengths, n=40)
    for e in drops:
        assert (e["inputs"] < VOCAB_SIZE - 100).all() and (e["targets"] < VOCAB_SIZE - 100).all()
    for e in _run(objectives.mass_style_denoising, sequence_length=lengths, n=40):
        keep = e["inputs"] != VOCAB_SIZE - 1
        np.testing.assert_array_equal(e["inputs"][keep], e["targets"][keep])
    for e in _run(objectives.deshuffling, sequence_length=lengths, n=40):
        np.testing.assert_array_equal(np.sort(e["inputs"]), np.sort(e["targets"]))
    originals = _run(lambda ds, of: objectives.split_documents(ds, 63), n=40)
    originals = [o for o in originals if len(o["targets"]) >= 2]
    for e, o in zip(_run(objectives.prefix_lm, sequence_length=lengths, n=40), originals):
        assert 1 <= len(e["inputs"]) <= 62 and 1 <= len(e["targets"]) <= 62
        np.testing.assert_array_equal(np.concatenate([e["inputs"], e["targets"]]), o["targets"])
    split_points = {len(e["inputs"]) for e in _run(objectives.prefix_lm, sequence_length=lengths)}
    assert len(split_points) > 10  # a random split point


def test_limit_tokens():
    ds = objectives.limit_tokens(_docs(100), 5000)
    sizes = [len(e["targets"]) for e in ds.as_numpy_iterator()]
    assert sum(sizes) <= 5000 < sum(sizes) + 400


# ----------------------------------------------------------------------------- paper fidelity


def _num_spans(mask):
    return int(mask[0]) + int(np.sum(mask[1:] & ~mask[:-1]))


def _counts(length, density, span, seed=(1, 2)):
    """(noise tokens, noise spans) of a real random_spans_noise_mask."""
    mask = objectives.random_spans_noise_mask(
        length, density, [tf.constant(seed), tf.constant([seed[1], seed[0]])], span).numpy()
    return int(mask.sum()), _num_spans(mask)


def test_random_spans_helper_is_t5s():
    """T5's helper number for number: float64 counts without the mask's one-span clamp, and
    at density 0.5 one off both lengths without recounting (compared with the chunk's inputs)."""
    assert objectives.random_spans_helper(172, 0.15, 3.0) == (190, 38)  # the mask makes 40
    assert objectives.random_spans_helper(16, 0.1, 5.0) == (17, 3)  # 0 spans; the mask has 1
    assert objectives.random_spans_helper(19, 0.5, 3.0) == (26, 19)  # a recount would say 18
    assert objectives.random_spans_helper(512, 0.5, 3.0) == (766, 512)  # 767 needs 513
    assert objectives.random_spans_helper(512, 0.15, 10.0) == (591, 99)


def test_span_trim_rate_counts_what_the_real_mask_makes():
    """Where T5's helper promises fewer tokens than its mask makes, seqio trims real tokens off
    every full chunk; span_surplus must be that surplus exactly and span_trim_rate its rate."""
    assert t5_objectives.span_surplus(172, 0.15, 3.0) == (0, 2)
    exs = _run(functools.partial(objectives.span_corruption, noise_density=0.15),
               sequence_length={"inputs": 172, "targets": 38}, n=40)
    full = [e for e in exs if len(_merge(e["inputs"], e["targets"])) == 190]
    assert full and {(len(e["inputs"]) + 1, len(e["targets"]) + 1) for e in full} == {(172, 40)}
    rng = np.random.RandomState(0)
    settings = [(172, 0.15, 3.0), (16, 0.1, 5.0)] + [(l, 0.5, s) for l in range(16, 40, 3)
                                                      for s in (2.0, 3.0, 5.0)]
    settings += [(int(rng.randint(8, 1200)), float(rng.choice([0.05, 0.1, 0.15, 0.3, 0.35, 0.5])),
                  float(rng.choice([1.0, 2.0, 3.0, 5.0, 8.0, 10.0]))) for _ in range(50)]
    nonzero = 0
    for inputs_length, density, span in settings:
        tokens, targets = objectives.random_spans_helper(inputs_length, density, span)
        noise, spans = _counts(tokens, density, span, seed=(inputs_length, 7))
        surplus = t5_objectives.span_surplus(inputs_length, density, span)
        assert surplus == (tokens - noise + spans + 1 - inputs_length, noise + spans + 1 - targets)
        nonzero += surplus != (0, 0)
    assert nonzero >= 5
    # the paper's densities and span lengths at inputs lengths 64, 128, ..., 1024: only 640 at
    # 0.15 / 3 (a 710-token chunk: 107 noise tokens in float32, 106 in float64) trims
    paper = itertools.product(range(64, 1025, 64), (0.1, 0.15, 0.25, 0.5), (2.0, 3.0, 5.0, 10.0))
    assert t5_objectives.span_trim_rate(paper) == {
        "settings": 256, "inputs_trimmed": 0.0, "targets_trimmed": 1 / 256,
        "max_tokens_trimmed": 2}
    assert t5_objectives.span_surplus(640, 0.15, 3.0) == (0, 2)
    assert t5_objectives.span_trim_rate(
        [(172, 0.15, 3.0), (512, 0.15, 3.0), (16, 0.1, 5.0), (19, 0.5, 3.0)]) == {
        "settings": 4, "inputs_trimmed": 0.25, "targets_trimmed": 0.5, "max_tokens_trimmed": 2}


def test_iid_sentinels_agree_when_the_first_token_is_corrupted():
    """T5's targets function replaced non-noise spans by sentinels, so with a corrupted first
    token (i.i.d. masks) every target sentinel pointed at the wrong span."""
    rng = np.random.RandomState(1)
    first_noise = 0
    for i in range(300):
        length = int(rng.randint(2, 60))
        mask = rng.rand(length) < float(rng.choice([0.15, 0.5, 0.8]))
        if i % 3 == 0:
            mask[0] = True
        first_noise += int(mask[0])
        tokens = rng.randint(3, 900, size=length).astype(np.int32)
        inputs = objectives.noise_span_to_unique_sentinel(tf.constant(tokens), tf.constant(mask),
                                                          VOCAB).numpy()
        targets = objectives.nonnoise_span_to_unique_sentinel(
            tf.constant(tokens), tf.constant(mask), VOCAB).numpy()
        np.testing.assert_array_equal(_merge(inputs, targets), tokens)
        in_sent = [t for t in inputs if t >= VOCAB_SIZE - 100]
        tgt_sent = [t for t in targets if t >= VOCAB_SIZE - 100]
        assert tgt_sent[:len(in_sent)] == in_sent  # (+ T5's trailing one after kept text)
        if mask.any():
            assert targets[0] == VOCAB_SIZE - 1
    assert first_noise > 100
    # the whole objective, first token corrupted in many chunks: exact reconstruction
    exs = _run(objectives.iid_denoising, sequence_length={"inputs": 32, "targets": 32}, n=300)
    originals = _run(lambda ds, of: objectives.concat_and_split(ds, 31), n=300)
    starts = 0
    for e, o in zip(exs, originals):
        starts += int(e["inputs"][0] >= VOCAB_SIZE - 100)
        np.testing.assert_array_equal(_merge(e["inputs"], e["targets"]), o["targets"])
    assert starts > 50


def test_drop_tokens_uses_the_iid_rows_chunks():
    """The paper's "drop corrupted tokens" row uses the same 511-token chunks as the other
    i.i.d. rows (not longer chunks whose kept tokens fill 512 and get cut)."""
    lengths = {"inputs": 64, "targets": 64}
    originals = _run(lambda ds, of: objectives.concat_and_split(ds, 63), n=60)
    exs = _run(objectives.drop_tokens, sequence_length=lengths, n=60)
    assert len(exs) == len(originals)
    for e, o in zip(exs, originals):
        assert len(e["inputs"]) + len(e["targets"]) == len(o["targets"]) <= 63
        merged = np.sort(np.concatenate([e["inputs"], e["targets"]]))
        np.testing.assert_array_equal(merged, np.sort(o["targets"]))


@pytest.mark.parametrize("name", ["prefix_lm", "deshuffling"])
def test_prefix_lm_and_deshuffling_chunks_stay_in_one_document(name):
    rng = np.random.RandomState(0)
    docs = [np.full(int(rng.randint(5, 90)), 3 + i, np.int32) for i in range(200)]  # 1 id/doc
    ds = tf.data.Dataset.from_generator(lambda: ({"targets": d} for d in docs),
                                        output_signature={"targets": tf.TensorSpec([None],
                                                                                   tf.int32)})
    with seqio.map_seed_manager(0):
        exs = list(getattr(objectives, name)(ds, FEATURES, {"inputs": 32, "targets": 33})
                   .as_numpy_iterator())
    assert len(exs) > 200
    for e in exs:
        assert len(set(np.concatenate([e["inputs"], e["targets"]]).tolist())) == 1


def test_iid_denoising_lm_is_one_sequence():
    """Table 2's decoder-only LM x denoising: inputs EOS targets as one target sequence (the
    reference's delimited LM), from the encoder-decoder row's chunks."""
    total = 128 + objectives.iid_targets_length(128, 0.15)
    exs = _run(objectives.iid_denoising_lm, sequence_length={"targets": total}, n=60)
    originals = _run(lambda ds, of: objectives.concat_and_split(ds, 127), n=60)
    for e, o in zip(exs, originals):
        assert set(e) == {"targets"} and len(e["targets"]) < total
        eos = list(e["targets"]).index(VOCAB.eos_id)
        inputs, targets = e["targets"][:eos], e["targets"][eos + 1:]
        np.testing.assert_array_equal(_merge(inputs, targets), o["targets"])
