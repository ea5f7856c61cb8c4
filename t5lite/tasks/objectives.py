"""Pretraining objectives of the T5 paper (and BERT / GPT) as seqio preprocessors.

Every objective is a dataset -> dataset function with seqio's keyword conventions
(``output_features``, ``sequence_length``), so any Task can compose it. Randomness uses stateless
TF ops whose seeds come from ``seqio.map_over_dataset(num_seeds=...)``; seqio draws those from
``map_seed_manager(seed)``, so the same seed gives the same data.

The unsupervised objectives (Raffel et al. 2020, Section 3.3) are all one ``denoise`` call with a
different noise mask, inputs function and targets function:

  objective (paper)        noise_mask  inputs_fn                       targets_fn
  span corruption (Tab. 7) spans       noise_span_to_unique_sentinel   nonnoise_span_to_unique_...
  i.i.d. / replace spans   iid         noise_span_to_unique_sentinel   nonnoise_span_to_unique_...
  drop corrupted tokens    iid         drop_noise_tokens               drop_nonnoise_tokens
  BERT-style (90/10/0)     iid         noise_token_to_random_token_or_sentinel  original_tokens
  MASS-style               iid         noise_token_to_sentinel         original_tokens

with deshuffling, prefix LM and full LM alongside. Corruption rate (Table 6) is
``noise_density``, span length (Table 7) ``mean_noise_span_length``; Tables 8-9 (data set and
size) are the task choice plus ``limit_tokens``.

Sentinels count down from the end of the vocabulary: span k (k = 0, 1, ...) gets
``vocab.vocab_size - 1 - k``, which is seqio's ``<extra_id_k>``.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Callable, Optional

import seqio
import tensorflow as tf

map_over_dataset = seqio.map_over_dataset


# ----------------------------------------------------------------------------- lengths


def _span_counts(tokens_length: int, noise_density: float, mean_noise_span_length: float):
    """(noise tokens, non-noise tokens, noise spans) of a chunk, exactly as
    random_spans_noise_mask computes them (both in float64 with round-half-to-even)."""
    num_noise = int(round(tokens_length * noise_density))
    num_noise = min(max(num_noise, 1), tokens_length - 1)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    return num_noise, tokens_length - num_noise, num_spans


def random_spans_helper(inputs_length: int = 512, noise_density: float = 0.15,
                        mean_noise_span_length: float = 3.0,
                        extra_tokens_per_span_inputs: int = 1,
                        extra_tokens_per_span_targets: int = 1) -> tuple[int, int]:
    """(tokens_length, targets_length) for span corruption with ``inputs_length`` inputs.

    tokens_length is the longest uncorrupted chunk whose corrupted inputs (kept tokens, one
    sentinel per span, EOS) still fit in inputs_length; targets_length is what its targets need
    (noise tokens, one sentinel per span, EOS). 512 at 0.15 / 3.0 gives (568, 114), the paper's
    setting.

    Differs from T5's helper on purpose: T5 counts in float64 here but the mask counts in
    float32 (e.g. 190 tokens at 0.15: 28.4999... -> 28 here, 28.500002 -> 29 in the mask), and
    its density-0.5 trim takes one off both lengths without recounting; either way the targets
    could come out longer than promised and seqio trimmed them silently. Here the mask uses the
    same float64 count (``_span_counts``) and the trim recounts, so the promise is exact.
    """
    def lengths(tokens_length):
        num_noise, num_nonnoise, num_spans = _span_counts(
            tokens_length, noise_density, mean_noise_span_length)
        return (num_nonnoise + num_spans * extra_tokens_per_span_inputs + 1,
                num_noise + num_spans * extra_tokens_per_span_targets + 1)

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    # At density 0.5 the targets can come out one longer than the inputs; trim for symmetry
    # (T5's choice), recounting the lengths of the shorter chunk.
    while (noise_density == 0.5 and lengths(tokens_length)[1] > inputs_length
           and tokens_length > 2):
        tokens_length -= 1
    return tokens_length, lengths(tokens_length)[1]


# ----------------------------------------------------------------------------- noise masks


def _random_segmentation(num_items, num_segments, seed):
    """Lengths of a uniformly random partition of num_items into num_segments non-empty parts."""
    first_in_segment = tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32)
    first_in_segment = tf.pad(seqio.utils.stateless_shuffle(first_in_segment, seed), [[1, 0]])
    segment_id = tf.cumsum(first_in_segment)
    return tf.math.unsorted_segment_sum(tf.ones_like(segment_id), segment_id, num_segments)


def random_spans_noise_mask(length, noise_density, seeds, mean_noise_span_length=3.0):
    """Bool [length] mask of noise spans; spans alternate non-noise / noise, non-noise first.

    The number of noise tokens is round(length * noise_density) and the number of noise spans
    round(num_noise / mean_noise_span_length), so both are exact per example (not just on
    average). ``seeds``: two stateless seeds.
    """
    orig_length = length
    length = tf.maximum(length, 2)
    # float64, as _span_counts / random_spans_helper (T5 used float32 here: see the helper)
    num_noise = tf.cast(tf.round(tf.cast(length, tf.float64) * noise_density), tf.int32)
    num_noise = tf.clip_by_value(num_noise, 1, length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float64) / mean_noise_span_length),
                        tf.int32)
    num_spans = tf.maximum(num_spans, 1)
    noise_lengths = _random_segmentation(num_noise, num_spans, seeds[0])
    nonnoise_lengths = _random_segmentation(length - num_noise, num_spans, seeds[1])
    interleaved = tf.reshape(tf.stack([nonnoise_lengths, noise_lengths], axis=1), [-1])
    span_starts = tf.cumsum(interleaved)[:-1]
    span_start_indicator = tf.math.unsorted_segment_sum(
        tf.ones_like(span_starts), span_starts, length)
    is_noise = tf.equal(tf.math.floormod(tf.cumsum(span_start_indicator), 2), 1)
    return is_noise[:orig_length]


def iid_noise_mask(length, noise_density, seeds, mean_noise_span_length=None):
    """Each token is noise independently with probability noise_density."""
    del mean_noise_span_length
    return tf.random.stateless_uniform([length], seed=seeds[0]) < noise_density


NOISE_MASKS = {"spans": random_spans_noise_mask, "iid": iid_noise_mask}


# ----------------------------------------------------------------------------- inputs / targets


def noise_span_to_unique_sentinel(tokens, noise_mask, vocabulary, seeds=None):
    """Replace each noise span by one sentinel (counting down from the vocab end)."""
    del seeds
    prev_noise = tf.pad(noise_mask[:-1], [[1, 0]])
    first_noise = tf.logical_and(noise_mask, tf.logical_not(prev_noise))
    subsequent_noise = tf.logical_and(noise_mask, prev_noise)
    sentinel = vocabulary.vocab_size - tf.cumsum(tf.cast(first_noise, tokens.dtype))
    tokens = tf.where(first_noise, sentinel, tokens)
    return tf.boolean_mask(tokens, tf.logical_not(subsequent_noise))


def nonnoise_span_to_unique_sentinel(tokens, noise_mask, vocabulary, seeds=None):
    """Targets of span corruption: the noise spans, each preceded by its sentinel (noise span
    k -> vocab_size - 1 - k, the sentinel that replaced it in the inputs).

    T5 replaces each non-noise span by the next sentinel instead, which is the same when the
    first token is kept (always so for random_spans_noise_mask) but, when the first token is
    noise (i.i.d. masks), leaves the first span without a sentinel and pairs every later span
    with its neighbour's sentinel. Here a first-token noise span gets vocab_size - 1 and the
    rest shift down by one, so inputs and targets always agree.
    """
    del seeds
    nonnoise = tf.logical_not(noise_mask)
    prev_nonnoise = tf.pad(nonnoise[:-1], [[1, 0]])
    first_nonnoise = tf.logical_and(nonnoise, tf.logical_not(prev_nonnoise))
    starts_noise = tf.cast(noise_mask[0], tokens.dtype)
    sentinel = (vocabulary.vocab_size - starts_noise
                - tf.cumsum(tf.cast(first_nonnoise, tokens.dtype)))
    out = tf.boolean_mask(tf.where(first_nonnoise, sentinel, tokens),
                          tf.logical_not(tf.logical_and(nonnoise, prev_nonnoise)))
    lead = tf.fill(tf.cast([starts_noise], tf.int32),
                   tf.cast(vocabulary.vocab_size - 1, tokens.dtype))
    return tf.concat([lead, out], 0)


def drop_noise_tokens(tokens, noise_mask, vocabulary=None, seeds=None):
    del vocabulary, seeds
    return tf.boolean_mask(tokens, tf.logical_not(noise_mask))


def drop_nonnoise_tokens(tokens, noise_mask, vocabulary=None, seeds=None):
    del vocabulary, seeds
    return tf.boolean_mask(tokens, noise_mask)


def noise_token_to_sentinel(tokens, noise_mask, vocabulary, seeds=None):
    """MASS-style: every noise token becomes the one mask token (the first sentinel)."""
    del seeds
    return tf.where(noise_mask, tf.cast(vocabulary.vocab_size - 1, tokens.dtype), tokens)


def random_token_range(vocabulary) -> tuple[int, int]:
    """[low, high) of ordinary tokens for random replacement: no sentinels, and above / below
    the special ids (pad, EOS, UNK, and [CLS] / [SEP] / [MASK] where the vocabulary has them;
    GPT-2's EOS is its last id)."""
    high = vocabulary.vocab_size - (vocabulary.extra_ids or 0)
    specials = {i for i in (getattr(vocabulary, name, None) for name in
                            ("pad_id", "eos_id", "unk_id", "cls_id", "sep_id", "mask_id"))
                if i is not None}
    while high - 1 in specials:
        high -= 1
    low = 1 + max((i for i in specials if i < high), default=-1)
    return low, high


def noise_token_to_random_token_or_sentinel(tokens, noise_mask, vocabulary, seeds,
                                            mask_prob=0.8, random_prob=0.1):
    """BERT-style: of the noise tokens, mask_prob -> mask token, random_prob -> a random token,
    the rest kept."""
    u = tf.random.stateless_uniform(tf.shape(tokens), seed=seeds[0])
    low, high = random_token_range(vocabulary)
    random_tokens = tf.random.stateless_uniform(
        tf.shape(tokens), seed=seeds[1], minval=low, maxval=high, dtype=tokens.dtype)
    mask_token = tf.cast(vocabulary.vocab_size - 1, tokens.dtype)
    replaced = tf.where(u < mask_prob, mask_token,
                        tf.where(u < mask_prob + random_prob, random_tokens, tokens))
    return tf.where(noise_mask, replaced, tokens)


def original_tokens(tokens, noise_mask=None, vocabulary=None, seeds=None):
    del noise_mask, vocabulary, seeds
    return tokens


TOKEN_FNS = {f.__name__: f for f in (
    noise_span_to_unique_sentinel, nonnoise_span_to_unique_sentinel, drop_noise_tokens,
    drop_nonnoise_tokens, noise_token_to_sentinel, noise_token_to_random_token_or_sentinel,
    original_tokens)}


def _resolve(fn, table):
    return table[fn] if isinstance(fn, str) else fn


# ----------------------------------------------------------------------------- dataset helpers


def _vocab(output_features, key="targets"):
    return output_features[key].vocabulary if key in output_features else (
        output_features["inputs"].vocabulary)


def _chunks(tokens, length: int) -> tf.data.Dataset:
    """A 1-D token tensor -> its consecutive chunks of ``length`` (the last may be shorter)."""
    n = tf.size(tokens)
    num_full = n // length
    rem = n - num_full * length
    row_lengths = tf.concat([tf.fill([num_full], length), tf.boolean_mask([rem], [rem > 0])], 0)
    return tf.data.Dataset.from_tensor_slices(tf.RaggedTensor.from_row_lengths(tokens,
                                                                               row_lengths))


def concat_and_split(ds: tf.data.Dataset, length: int, key: str = "targets",
                     batch_size: int = 128, separator_id: Optional[int] = None):
    """Concatenate the token sequences of consecutive examples (up to batch_size at a time)
    and cut them into chunks of ``length`` tokens (the last of each batch may be shorter).

    Drops every feature except ``key``. Fills every example, which packing then need not do.
    """
    ds = ds.map(lambda x: x[key], num_parallel_calls=tf.data.AUTOTUNE)
    if separator_id is not None:
        ds = ds.map(lambda t: tf.concat([t, tf.constant([separator_id], t.dtype)], 0))
    ds = ds.filter(lambda t: tf.size(t) > 0)
    ds = ds.ragged_batch(batch_size).flat_map(lambda rt: _chunks(rt.flat_values, length))
    return ds.map(lambda t: {key: t}, num_parallel_calls=tf.data.AUTOTUNE)


def split_documents(ds: tf.data.Dataset, length: int, key: str = "targets"):
    """Cut each example's tokens into chunks of ``length`` (the last of a document may be
    shorter); no chunk spans two documents (T5's select_random_chunk + split_tokens, used by
    its prefix-LM and deshuffling objectives). Drops every feature except ``key``."""
    ds = ds.map(lambda x: x[key], num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.filter(lambda t: tf.size(t) > 0).flat_map(lambda t: _chunks(t, length))
    return ds.map(lambda t: {key: t}, num_parallel_calls=tf.data.AUTOTUNE)


def limit_tokens(dataset: tf.data.Dataset, max_tokens: int, key: str = "targets"):
    """Keep the first examples until ``max_tokens`` tokens (the paper's Table 9 data sizes;
    the training pipeline repeats the result)."""
    def step(total, ex):
        total += tf.cast(tf.size(ex[key]), tf.int64)
        return total, (total, ex)
    ds = dataset.scan(tf.constant(0, tf.int64), step)
    ds = ds.take_while(lambda total, ex: total <= max_tokens)
    return ds.map(lambda total, ex: ex)


# ----------------------------------------------------------------------------- denoising


def denoise(dataset, output_features, sequence_length=None, *, noise_density=0.15,
            noise_mask: str | Callable = "spans", mean_noise_span_length=3.0,
            inputs_fn: str | Callable = "noise_span_to_unique_sentinel",
            targets_fn: str | Callable = "nonnoise_span_to_unique_sentinel",
            tokens_length: Optional[int] = None, split: bool = True,
            input_feature_key="inputs"):
    """The general denoising objective: ``targets`` tokens -> (``inputs``, ``targets``).

    With ``split`` the token stream is concatenated and cut into chunks of ``tokens_length``
    (default: the longest chunk whose corrupted inputs fit ``sequence_length["inputs"]``, via
    random_spans_helper for span-replacing objectives, else inputs length - 1). EOS is added
    afterwards by seqio.preprocessors.append_eos_after_trim.
    """
    vocabulary = _vocab(output_features)
    mask_fn = _resolve(noise_mask, NOISE_MASKS)
    in_fn = _resolve(inputs_fn, TOKEN_FNS)
    tgt_fn = _resolve(targets_fn, TOKEN_FNS)
    if split:
        if tokens_length is None:
            inputs_length = (sequence_length or {}).get("inputs") or 512
            if in_fn is noise_span_to_unique_sentinel and mask_fn is random_spans_noise_mask:
                tokens_length, _ = random_spans_helper(
                    inputs_length, noise_density, mean_noise_span_length)
            else:  # every i.i.d. row, "drop corrupted tokens" too (the paper's 511-token chunks)
                tokens_length = inputs_length - 1
        dataset = concat_and_split(dataset, tokens_length)
        if mask_fn is random_spans_noise_mask and in_fn is noise_span_to_unique_sentinel:
            spans = _span_counts(tokens_length, noise_density, mean_noise_span_length)[2]
            if spans > (vocabulary.extra_ids or 0):
                logging.warning("%d noise spans per example but %d sentinels: the extra "
                                "sentinels overlap ordinary tokens (as in T5).", spans,
                                vocabulary.extra_ids or 0)

    @map_over_dataset(num_seeds=4)
    def corrupt(features, seeds):
        tokens = features["targets"]
        mask = mask_fn(tf.size(tokens), noise_density, seeds[:2],
                       mean_noise_span_length=mean_noise_span_length)
        return {**features,
                input_feature_key: in_fn(tokens, mask, vocabulary, seeds=seeds[2:]),
                "targets": tgt_fn(tokens, mask, vocabulary, seeds=seeds[2:])}

    return corrupt(dataset)


span_corruption = functools.partial(denoise, noise_mask="spans")
iid_denoising = functools.partial(denoise, noise_mask="iid")
drop_tokens = functools.partial(denoise, noise_mask="iid", inputs_fn="drop_noise_tokens",
                                targets_fn="drop_nonnoise_tokens")
# The paper's "BERT-style" row (Section 3.3.1, T5's bert-style gin): of the corrupted tokens 90%
# become the mask token and 10% a random token, none kept (BERT itself keeps 10%: bert_mlm).
bert_style_denoising = functools.partial(
    denoise, noise_mask="iid", inputs_fn=functools.partial(
        noise_token_to_random_token_or_sentinel, mask_prob=0.9, random_prob=0.1),
    targets_fn="original_tokens")
mass_style_denoising = functools.partial(
    denoise, noise_mask="iid", inputs_fn="noise_token_to_sentinel",
    targets_fn="original_tokens")


def deshuffling(dataset, output_features, sequence_length=None, tokens_length=None):
    """Inputs: the chunk's tokens in random order; targets: the original order. Chunks come
    from one document each (split_documents)."""
    length = tokens_length or ((sequence_length or {}).get("inputs") or 512) - 1
    dataset = split_documents(dataset, length)

    @map_over_dataset(num_seeds=1)
    def shuffle(features, seed):
        tokens = features["targets"]
        return {**features, "inputs": seqio.utils.stateless_shuffle(tokens, seed)}

    return shuffle(dataset)


def prefix_lm(dataset, output_features, sequence_length=None):
    """Split a chunk at a uniformly random point: prefix -> inputs, the rest -> targets.

    Chunks are min(inputs_length, targets_length - 1) tokens of one document each (as T5's
    prefix_lm), so every split point fits (the targets get EOS, the inputs none); packing fills
    the rest of a decoder row.
    """
    lengths = sequence_length or {"inputs": 512, "targets": 512}
    dataset = split_documents(dataset, min(lengths["inputs"], lengths["targets"] - 1))

    @map_over_dataset(num_seeds=1)
    def split_point(features, seed):
        tokens = features["targets"]
        k = tf.random.stateless_uniform([], seed=seed, minval=1, maxval=tf.size(tokens),
                                        dtype=tf.int32)
        return {"inputs": tokens[:k], "targets": tokens[k:]}

    return split_point(dataset.filter(lambda x: tf.size(x["targets"]) >= 2))


def iid_targets_length(inputs_length: int, noise_density: float) -> int:
    """Targets length for i.i.d. corruption with spans -> sentinels on inputs_length - 1
    tokens: noise + one sentinel per noise run (expected n d (1 - d)) + EOS, 25% headroom,
    rounded up to a multiple of 8."""
    n = inputs_length - 1
    expected = n * noise_density + n * noise_density * (1 - noise_density) + 1
    return int(math.ceil(1.25 * expected / 8) * 8)


def iid_denoising_lm(dataset, output_features, sequence_length=None, noise_density=0.15):
    """The paper's denoising baseline for a decoder-only LM (Table 2, "Language model" x
    "Denoising"): i.i.d. replace-spans on the same chunks as the encoder-decoder row with
    inputs length L, where ``targets`` = L + iid_targets_length(L) (the largest such L that
    fits), then one sequence inputs EOS targets (inputs_then_targets)."""
    total = ((sequence_length or {}).get("targets") or 512)
    inputs_length = 2
    while inputs_length + 1 + iid_targets_length(inputs_length + 1, noise_density) <= total:
        inputs_length += 1
    dataset = iid_denoising(dataset, output_features, {"inputs": inputs_length},
                            noise_density=noise_density)
    return inputs_then_targets(dataset, output_features)


def inputs_then_targets(dataset, output_features, sequence_length=None):
    """text2text -> text2self for a decoder-only language model: targets = inputs, EOS,
    targets (the reference's delimited LM, whose loss covers the whole concatenation: the
    paper's "next-step prediction over the concatenated input sequence"). Run it after the
    objective; append_eos_after_trim then ends the targets."""
    eos = _vocab(output_features).eos_id

    def concat(x):
        t = x["targets"]
        return {"targets": tf.concat([x["inputs"], tf.constant([eos], t.dtype), t], 0)}

    return dataset.map(concat, num_parallel_calls=tf.data.AUTOTUNE)


def full_lm(dataset, output_features, sequence_length=None):
    """Decoder LM: chunks of targets_length - 1 tokens (EOS after each document, and one more
    appended per chunk by append_eos_after_trim)."""
    length = ((sequence_length or {}).get("targets") or 512) - 1
    eos = _vocab(output_features).eos_id
    return concat_and_split(dataset, length, separator_id=eos)


# ----------------------------------------------------------------------------- BERT


def bert_special_ids(vocabulary) -> dict:
    """[CLS], [SEP], [MASK] ids. A WordPiece vocabulary exposes cls_id / sep_id / mask_id; for a
    SentencePiece vocabulary the last sentinels stand in (mask = <extra_id_0>)."""
    top = vocabulary.vocab_size - 1
    return {"cls": getattr(vocabulary, "cls_id", top - 1),
            "sep": getattr(vocabulary, "sep_id", top - 2),
            "mask": getattr(vocabulary, "mask_id", top)}


def bert_mlm(dataset, output_features, sequence_length=None, *, mask_rate=0.15,
             mask_prob=0.8, random_prob=0.1):
    """BERT masked LM on ``inputs`` (already [CLS] ... [SEP]): select mask_rate of the
    non-special tokens; of those mask_prob -> [MASK], random_prob -> random token, rest kept.

    Adds ``targets`` (the original tokens) and ``loss_weights`` (1 on selected positions).
    """
    vocabulary = output_features["inputs"].vocabulary
    special = bert_special_ids(vocabulary)
    low, high = random_token_range(vocabulary)

    @map_over_dataset(num_seeds=3)
    def mask(features, seeds):
        tokens = features["inputs"]
        shape = tf.shape(tokens)
        maskable = tf.logical_not(tf.reduce_any(
            tokens[:, None] == tf.constant([special["cls"], special["sep"], 0],
                                           tokens.dtype)[None, :], axis=1))
        selected = tf.logical_and(
            tf.random.stateless_uniform(shape, seed=seeds[0]) < mask_rate, maskable)
        u = tf.random.stateless_uniform(shape, seed=seeds[1])
        random_tokens = tf.random.stateless_uniform(
            shape, seed=seeds[2], minval=low, maxval=high, dtype=tokens.dtype)
        replaced = tf.where(u < mask_prob, tf.cast(special["mask"], tokens.dtype),
                            tf.where(u < mask_prob + random_prob, random_tokens, tokens))
        return {**features, "inputs": tf.where(selected, replaced, tokens), "targets": tokens,
                "loss_weights": tf.cast(selected, tf.int32)}

    return mask(dataset)


def bert_pairs(dataset, output_features, sequence_length=None, *, nsp=True,
               window: int = 64):
    """[CLS] A [SEP] B [SEP] rows with ``token_type_ids`` (and ``nsp_labels`` with nsp).

    The token stream is cut into chunks of inputs_length - 3 tokens (BERT's "sentences" are
    contiguous spans, as here); each chunk is split at a random point into A and B. With
    ``nsp``, half the rows replace B by the B of another chunk in a window of ``window``
    chunks (nsp_labels 1 = random next, 0 = actual next, BERT's convention).
    """
    vocabulary = output_features["inputs"].vocabulary
    special = bert_special_ids(vocabulary)
    length = ((sequence_length or {}).get("inputs") or 512)
    dataset = concat_and_split(dataset, length - 3, key="inputs")
    dataset = dataset.filter(lambda x: tf.size(x["inputs"]) >= 2)

    @map_over_dataset(num_seeds=1)
    def split_ab(features, seed):
        tokens = features["inputs"]
        k = tf.random.stateless_uniform([], seed=seed, minval=1, maxval=tf.size(tokens),
                                        dtype=tf.int32)
        return {"a": tokens[:k], "b": tokens[k:]}

    dataset = split_ab(dataset)
    if nsp:
        dataset = dataset.ragged_batch(window)

        @map_over_dataset(num_seeds=2)
        def swap(batch, seeds):
            n = batch["a"].nrows(out_type=tf.int32)
            is_random = tf.random.stateless_uniform([n], seed=seeds[0]) < 0.5
            # A partner other than itself (when the window has more than one chunk).
            offset = tf.random.stateless_uniform([n], seed=seeds[1], minval=1,
                                                 maxval=tf.maximum(n, 2), dtype=tf.int32)
            partner = tf.where(is_random & (n > 1), (tf.range(n) + offset) % n, tf.range(n))
            return {"a": batch["a"], "b": tf.gather(batch["b"], partner),
                    "nsp_labels": tf.cast(partner != tf.range(n), tf.int32)}

        dataset = swap(dataset).unbatch()

    def assemble(features):
        a, b = features["a"], features["b"]
        if isinstance(a, tf.RaggedTensor):
            a, b = a.flat_values, b.flat_values
        b = b[:tf.maximum(length - 3 - tf.size(a), 1)]
        a = a[:length - 3 - tf.size(b)]
        dt = a.dtype
        cls_ = tf.constant([special["cls"]], dt)
        sep = tf.constant([special["sep"]], dt)
        out = {"inputs": tf.concat([cls_, a, sep, b, sep], 0),
               "token_type_ids": tf.concat([tf.zeros([tf.size(a) + 2], tf.int32),
                                            tf.ones([tf.size(b) + 1], tf.int32)], 0)}
        if nsp:
            out["nsp_labels"] = features["nsp_labels"]
        return out

    return dataset.map(assemble, num_parallel_calls=tf.data.AUTOTUNE)


def bert_single(dataset, output_features, sequence_length=None):
    """[CLS] chunk [SEP] rows of inputs_length - 2 stream tokens (MLM without NSP)."""
    vocabulary = output_features["inputs"].vocabulary
    special = bert_special_ids(vocabulary)
    length = ((sequence_length or {}).get("inputs") or 512)
    dataset = concat_and_split(dataset, length - 2, key="inputs")

    def wrap(features):
        t = features["inputs"]
        return {"inputs": tf.concat([tf.constant([special["cls"]], t.dtype), t,
                                     tf.constant([special["sep"]], t.dtype)], 0)}

    return dataset.map(wrap, num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- BART
#
# BART's noising functions (Lewis et al. 2019, Section 2.2) for the encoder-decoder models: the
# inputs are a corrupted chunk, the targets the chunk itself. Each noise maps a 1-D token
# tensor and two stateless seeds to the corrupted tokens; ``bart_denoising`` chains them.
# Semantics follow fairseq's denoising_dataset.py where the paper is silent, with the
# differences said at each function.


def bart_mask_id(vocabulary) -> int:
    """BART's single mask token: the vocabulary's mask id, else <extra_id_0> (as BERT's)."""
    return bert_special_ids(vocabulary)["mask"]


def _exact_count_mask(n, count, seed):
    """Bool [n] with exactly ``count`` True at uniformly random positions."""
    u = tf.random.stateless_uniform([n], seed=seed)
    return tf.argsort(tf.argsort(u)) < count


def _budget(n, rate):
    """round(n * rate) tokens to corrupt, leaving at least one token of a chunk intact."""
    count = tf.cast(tf.round(tf.cast(n, tf.float64) * rate), tf.int32)
    return tf.clip_by_value(count, 0, tf.maximum(n - 1, 0))


def _check_rate(rate):
    if not 0.0 < rate <= 0.5:
        from t5lite.errors import UserError
        raise UserError(f"BART noise rate {rate} must be in (0, 0.5] (the paper masks 0.3).")


def infilling_plan(n, rate, seeds, poisson_lambda=3.0):
    """Where text infilling puts its spans in a chunk of ``n`` tokens -> (has_span_S,
    span_len_S). budget = round(n * rate) tokens are masked and n - budget kept; the
    S = n - budget + 1 gaps are before each kept token and at the end: gap s holds a span
    (maybe of length 0) before kept token s when has_span_S[s]. ``rate`` <= 0.5 keeps the
    number of spans (at most the budget) within the gaps.

    Span lengths are Poisson(poisson_lambda) draws until they cover the budget, the last cut to
    fill it exactly (fairseq's rule); the lengths are then shuffled, so the cut one is not
    always last. Unlike fairseq, whose random span starts may overlap or touch (merging spans,
    masking less than the budget), spans go to distinct gaps: they never touch, each is exactly
    one mask token, and exactly the budget is masked. Zero-length spans that would make the
    inputs longer than the chunk are left out (only possible on very short chunks).
    """
    _check_rate(rate)
    budget = _budget(n, rate)
    num_draws = budget + 16  # the mean draw is ~3: 16 spare draws all but never run out
    draws = tf.random.stateless_poisson([num_draws], seeds[0], poisson_lambda, dtype=tf.int32)
    cum = tf.cumsum(draws)
    k = tf.minimum(tf.reduce_sum(tf.cast(cum < budget, tf.int32)) + 1, num_draws)
    k = tf.where(budget > 0, k, 0)
    before_last = tf.gather(tf.concat([[0], cum], 0), tf.maximum(k - 1, 0))
    lengths = tf.where(tf.range(num_draws) == k - 1, budget - before_last, draws)[:k]
    # inputs = n - budget kept tokens + one mask per span: at most n when spans <= budget
    is_zero = tf.equal(lengths, 0)
    room = budget - tf.reduce_sum(tf.cast(tf.logical_not(is_zero), tf.int32))
    keep = tf.logical_or(tf.logical_not(is_zero),
                         tf.cumsum(tf.cast(is_zero, tf.int32)) <= room)
    lengths = seqio.utils.stateless_shuffle(tf.boolean_mask(lengths, keep), seeds[1])
    num_gaps = n - budget + 1
    u = tf.random.stateless_uniform([num_gaps], seed=tf.random.experimental.stateless_fold_in(
        seeds[1], 1))
    has_span = tf.argsort(tf.argsort(u)) < tf.size(lengths)  # rate <= 0.5: spans fit the gaps
    where = tf.cast(tf.where(has_span), tf.int32)
    span_len = tf.scatter_nd(where, lengths, [num_gaps])
    return has_span, span_len


def text_infilling(tokens, seeds, vocabulary, rate=0.3, poisson_lambda=3.0, **unused):
    """BART text infilling: Poisson(poisson_lambda)-length spans covering round(rate * n)
    tokens, each span replaced by one mask token; a zero-length span inserts one."""
    n = tf.size(tokens)
    has_span, span_len = infilling_plan(n, rate, seeds, poisson_lambda)
    num_kept = tf.size(has_span) - 1
    kept_gap = tf.concat([tf.ones([num_kept], tf.int32), [0]], 0)  # gap s, then kept token s
    is_noise = tf.repeat(tf.tile([True, False], [tf.size(has_span)]),
                         tf.reshape(tf.stack([span_len, kept_gap], 1), [-1]))
    kept = tf.boolean_mask(tokens, tf.logical_not(is_noise))
    mask = tf.fill(tf.shape(has_span), tf.cast(bart_mask_id(vocabulary), tokens.dtype))
    values = tf.reshape(tf.stack([mask, tf.concat([kept, tf.zeros([1], tokens.dtype)], 0)], 1),
                        [-1])
    counts = tf.reshape(tf.stack([tf.cast(has_span, tf.int32), kept_gap], 1), [-1])
    return tf.repeat(values, counts)


def token_masking(tokens, seeds, vocabulary, rate=0.3, **unused):
    """BART token masking (BERT's, with the mask token only): round(rate * n) random tokens ->
    the mask token."""
    _check_rate(rate)
    chosen = _exact_count_mask(tf.size(tokens), _budget(tf.size(tokens), rate), seeds[0])
    return tf.where(chosen, tf.cast(bart_mask_id(vocabulary), tokens.dtype), tokens)


def token_deletion(tokens, seeds, vocabulary=None, rate=0.3, **unused):
    """BART token deletion: round(rate * n) random tokens deleted (the model must find where)."""
    _check_rate(rate)
    chosen = _exact_count_mask(tf.size(tokens), _budget(tf.size(tokens), rate), seeds[0])
    return tf.boolean_mask(tokens, tf.logical_not(chosen))


def document_rotation(tokens, seeds, vocabulary=None, **unused):
    """BART document rotation: a token chosen uniformly at random starts the chunk, which is
    rotated to begin there (the first token too: unchanged; fairseq always moves the start)."""
    k = tf.random.stateless_uniform([], seed=seeds[0], minval=0, maxval=tf.size(tokens),
                                    dtype=tf.int32)
    return tf.concat([tokens[k:], tokens[:k]], 0)


_FINAL_PUNCTUATION = (".", "!", "?")
_final_ids_cache: dict = {}


def sentence_final_ids(vocabulary) -> tuple:
    """Ids of the vocabulary's pieces that end a sentence: they end with . ! or ?, not after a
    digit (list numbers such as "1." do not end a sentence). fairseq splits on GPT-2's "."."""
    # keyed by the model file too: a local vocabulary follows the data dir when it moves
    key = (id(vocabulary), str(getattr(vocabulary, "sentencepiece_model_file", "")))
    if key not in _final_ids_cache:
        ids = []
        for i in range(vocabulary.vocab_size - (vocabulary.extra_ids or 0)):
            try:
                piece = vocabulary.decode([i]).rstrip()
            except Exception:  # ids with no text (e.g. pad / EOS in some vocabularies)
                continue
            body = piece.rstrip("".join(_FINAL_PUNCTUATION))
            if len(body) < len(piece) and not body[-1:].isdigit():
                ids.append(i)
        _final_ids_cache[key] = (vocabulary, tuple(ids))  # holding it keeps id() unique
    return _final_ids_cache[key][1]


def sentence_permutation(tokens, seeds, vocabulary=None, final_ids=None, **unused):
    """BART sentence permutation: the chunk's sentences in random order. A sentence ends at a
    run of sentence-final pieces (``final_ids``, default sentence_final_ids(vocabulary)); the
    text after the last one (cut by the chunk's end) is a sentence too, as in fairseq."""
    final_ids = sentence_final_ids(vocabulary) if final_ids is None else final_ids
    is_final = tf.reduce_any(tf.equal(tokens[:, None], tf.constant(
        list(final_ids) or [-1], tokens.dtype)[None, :]), axis=1)
    next_final = tf.concat([is_final[1:], [False]], 0)
    ends = tf.logical_and(is_final, tf.logical_not(next_final))
    sentence = tf.cumsum(tf.cast(ends, tf.int32), exclusive=True)
    num_sentences = sentence[-1] + 1
    order = seqio.utils.stateless_shuffle(tf.range(num_sentences), seeds[0])
    rank = tf.scatter_nd(order[:, None], tf.range(num_sentences), [num_sentences])
    return tf.gather(tokens, tf.argsort(tf.gather(rank, sentence), stable=True))


BART_NOISES = {"permutation": sentence_permutation, "infilling": text_infilling,
               "masking": token_masking, "deletion": token_deletion,
               "rotation": document_rotation}


def bart_denoising(dataset, output_features, sequence_length=None, *,
                   noises=("infilling",), rate=0.3, poisson_lambda=3.0,
                   tokens_length: Optional[int] = None, split: str = "stream"):
    """BART pretraining: ``targets`` = a chunk of text, ``inputs`` = the chunk after
    ``noises`` (BART_NOISES names, applied in that order; the paper's final model uses
    ("permutation", "infilling")). ``rate``: the fraction of tokens masked / deleted (the paper:
    0.3); ``poisson_lambda``: the mean infilling span length (3).

    Chunks are ``tokens_length`` tokens (default inputs length - 1: no noise makes the inputs
    longer, so they fit with EOS; the targets need the same length). ``split="stream"`` cuts
    them from the concatenated corpus, as the T5 objectives (the local corpus's lines are
    short dictionary entries, too short for sentence permutation or rotation to matter);
    "documents" keeps each chunk inside one example.
    """
    unknown = [n for n in noises if n not in BART_NOISES]
    if unknown or not noises:
        from t5lite.errors import UserError
        raise UserError(f"unknown BART noise {unknown or noises}; use any of "
                        f"{', '.join(BART_NOISES)}.")
    if any(n in ("infilling", "masking", "deletion") for n in noises):
        _check_rate(rate)
    vocabulary = _vocab(output_features)
    length = tokens_length or ((sequence_length or {}).get("inputs") or 512) - 1
    if split == "stream":
        dataset = concat_and_split(dataset, length)
    elif split == "documents":
        dataset = split_documents(dataset, length)
    else:
        from t5lite.errors import UserError
        raise UserError(f"BART split {split!r}: use stream or documents.")
    final_ids = sentence_final_ids(vocabulary) if "permutation" in noises else None

    @map_over_dataset(num_seeds=2 * len(noises))
    def corrupt(features, seeds):
        tokens = features["targets"]
        inputs = tokens
        for i, name in enumerate(noises):
            inputs = BART_NOISES[name](inputs, seeds[2 * i:2 * i + 2], vocabulary, rate=rate,
                                       poisson_lambda=poisson_lambda, final_ids=final_ids)
        return {**features, "inputs": inputs, "targets": tokens}

    return corrupt(dataset)


# ----------------------------------------------------------------------------- SpanBERT


def span_length_probs(geometric_p: float = 0.2, max_span_words: int = 10):
    """P(span = l words), l = 1..max_span_words: Geo(p) truncated at the maximum and
    renormalised, as SpanBERT's code does (mean 3.8 words at p = 0.2, the paper's figure;
    piling the tail onto the maximum instead would give 4.5)."""
    import numpy as np
    lengths = np.arange(1, max_span_words + 1)
    w = geometric_p * (1.0 - geometric_p) ** (lengths - 1)
    return w / w.sum()


def word_starts(vocabulary):
    """Bool numpy [vocab_size]: True where an id begins a word. SentencePiece: pieces starting
    with "▁" (plus control / unknown ids and sentinels); BERT WordPiece: every entry not
    starting with "##". Other vocabularies may define ``word_starts()`` themselves."""
    import numpy as np
    if hasattr(vocabulary, "word_starts"):
        table = np.asarray(vocabulary.word_starts(), bool)
    elif hasattr(vocabulary, "vocab_file"):  # BERT WordPiece
        with open(vocabulary.vocab_file, encoding="utf-8") as f:
            pieces = [line.rstrip("\n") for line in f]
        table = np.array([not p.startswith("##") for p in pieces], bool)
    elif isinstance(vocabulary, seqio.SentencePieceVocabulary):
        sp = vocabulary.tokenizer
        table = np.array([sp.id_to_piece(i).startswith("▁") or sp.is_control(i)
                          or sp.is_unknown(i) for i in range(sp.get_piece_size())], bool)
    else:
        from t5lite.errors import UserError
        raise UserError(f"span masking needs word boundaries: use a SentencePiece or BERT "
                        f"WordPiece vocabulary (got {type(vocabulary).__name__}), or give it "
                        "a word_starts() method.")
    out = np.ones([vocabulary.vocab_size], bool)  # sentinels / padding ids: whole words
    out[:len(table)] = table[:vocabulary.vocab_size]
    return out


def _sample_spans(word_len, budget, seeds, log_probs, max_fails: int = 20):
    """Word-level span sampling for one row: span id (1, 2, ...; 0 = unmasked) per word.

    Spans of whole words are drawn until ``budget`` tokens are masked: a length from
    ``log_probs``, an anchor word uniformly; a span that would touch (overlap or adjoin)
    an earlier one, or run past the row, is rejected and its length kept for the next
    anchor (so the lengths keep their distribution; after ``max_fails`` misses a new length
    is drawn). Adjoining spans are refused so that every span's boundary tokens are unmasked.
    The last span stops at the first word that reaches the budget (it may overshoot by
    less than one word: a word is never split).
    """
    num_words = tf.size(word_len)
    idx_W = tf.range(num_words)
    cum_W = tf.cumsum(word_len)
    max_attempts = 100 + 20 * budget

    def draw_length(attempt):
        key = tf.random.experimental.stateless_fold_in(seeds[1], attempt)
        return 1 + tf.cast(tf.random.stateless_categorical(log_probs[None], 1, key)[0, 0],
                           tf.int32)

    def cond(attempt, count, spans, length, fails, span_W):
        del spans, length, fails, span_W
        return (count < budget) & (attempt < max_attempts) & (num_words > 0)

    def body(attempt, count, spans, length, fails, span_W):
        key = tf.random.experimental.stateless_fold_in(seeds[0], attempt)
        anchor = tf.random.stateless_uniform([], key, 0, num_words, tf.int32)
        before = tf.gather(cum_W, anchor) - tf.gather(word_len, anchor)  # tokens before anchor
        # words j = anchor, anchor + 1, ... are taken while the count is still under budget
        masked_before_j = count + tf.gather(cum_W, tf.minimum(idx_W, num_words - 1)) - before
        taken = 1 + tf.reduce_sum(tf.cast(
            (idx_W >= anchor) & (idx_W < anchor + length - 1) & (masked_before_j < budget),
            tf.int32))
        end = anchor + taken  # exclusive
        in_span = (idx_W >= anchor) & (idx_W < end)
        added = tf.reduce_sum(tf.where(in_span, word_len, 0))
        # stopped by the row's end, neither by its length nor by the budget: does not fit
        cut = (end == num_words) & (taken < length) & (count + added < budget)
        near = (idx_W >= anchor - 1) & (idx_W <= end)
        ok = tf.logical_not(cut | tf.reduce_any(near & (span_W > 0)))
        span_W = tf.where(ok & in_span, spans + 1, span_W)
        count += tf.where(ok, added, 0)
        spans += tf.cast(ok, tf.int32)
        fails = tf.where(ok, 0, fails + 1)
        new_length = ok | (fails >= max_fails)
        fails = tf.where(new_length, 0, fails)
        length = tf.where(new_length, draw_length(attempt + 1), length)
        return attempt + 1, count, spans, length, fails, span_W

    init = (tf.constant(0), tf.constant(0), tf.constant(0), draw_length(0), tf.constant(0),
            tf.zeros([num_words], tf.int32))
    return tf.while_loop(cond, body, init)[-1]


def span_mlm(dataset, output_features, sequence_length=None, *, mask_rate=0.15,
             geometric_p=0.2, max_span_words=10, mask_prob=0.8, random_prob=0.1):
    """SpanBERT's span masking (Joshi et al. 2020) on ``inputs`` ([CLS] ... [SEP] rows).

    Contiguous spans of whole words (lengths: span_length_probs) are masked until
    round(mask_rate x maskable tokens) tokens are; a word's sub-tokens are masked together
    (word_starts; the row's first token starts a word). Per span: mask_prob -> every token
    [MASK], random_prob -> every token a random token, else kept. Adds ``targets`` (the
    original tokens), ``loss_weights`` (1 on masked tokens) and, for the Span Boundary
    Objective, per masked token ``span_left`` / ``span_right`` (positions of the unmasked
    tokens just before and after its span) and ``span_offset`` (1 for the span's first
    token, 2 for the next, ...); all three are 0 on unmasked tokens.
    """
    import numpy as np
    vocabulary = output_features["inputs"].vocabulary
    special = bert_special_ids(vocabulary)
    low, high = random_token_range(vocabulary)
    starts_V = tf.constant(word_starts(vocabulary))
    with np.errstate(divide="ignore"):  # p = 1: one-word spans, log 0 = -inf is fine here
        log_probs = tf.constant(np.log(span_length_probs(geometric_p, max_span_words)),
                                tf.float32)

    @map_over_dataset(num_seeds=4)
    def mask(features, seeds):
        tokens = features["inputs"]
        length = tf.size(tokens)
        pos_L = tf.range(length)
        maskable = tf.logical_not(tf.reduce_any(
            tokens[:, None] == tf.constant([special["cls"], special["sep"], 0],
                                           tokens.dtype)[None, :], axis=1))
        prev_maskable = tf.pad(maskable[:-1], [[1, 0]])
        is_start = maskable & (tf.gather(starts_V, tokens) | tf.logical_not(prev_maskable))
        word_L = tf.cumsum(tf.cast(is_start, tf.int32)) - 1  # word index (valid if maskable)
        num_words = tf.reduce_sum(tf.cast(is_start, tf.int32))
        word_L = tf.clip_by_value(word_L, 0, tf.maximum(num_words - 1, 0))
        word_len = tf.math.unsorted_segment_sum(tf.cast(maskable, tf.int32), word_L, num_words)
        n_maskable = tf.reduce_sum(tf.cast(maskable, tf.int32))
        budget = tf.maximum(tf.cast(tf.round(
            tf.cast(n_maskable, tf.float64) * mask_rate), tf.int32), 1)
        span_W = _sample_spans(word_len, budget, seeds[:2], log_probs)
        span_L = tf.where(maskable, tf.gather(span_W, word_L), 0)  # 0 = not masked
        selected = span_L > 0
        num_spans = tf.reduce_max(tf.pad(span_L, [[0, 1]])) + 1
        start_S = tf.math.unsorted_segment_min(pos_L, span_L, num_spans)
        end_S = tf.math.unsorted_segment_max(pos_L, span_L, num_spans)
        start_L, end_L = tf.gather(start_S, span_L), tf.gather(end_S, span_L)
        # one draw per span: all of its tokens get the same treatment
        u_L = tf.gather(tf.random.stateless_uniform([num_spans], seed=seeds[2]), span_L)
        random_tokens = tf.random.stateless_uniform(
            tf.shape(tokens), seed=seeds[3], minval=low, maxval=high, dtype=tokens.dtype)
        replaced = tf.where(u_L < mask_prob, tf.cast(special["mask"], tokens.dtype),
                            tf.where(u_L < mask_prob + random_prob, random_tokens, tokens))
        zeros = tf.zeros_like(pos_L)
        return {**features, "inputs": tf.where(selected, replaced, tokens), "targets": tokens,
                "loss_weights": tf.cast(selected, tf.int32),
                "span_left": tf.where(selected, tf.maximum(start_L - 1, 0), zeros),
                "span_right": tf.where(selected, tf.minimum(end_L + 1, length - 1), zeros),
                "span_offset": tf.where(selected, pos_L - start_L + 1, zeros)}

    return mask(dataset)
