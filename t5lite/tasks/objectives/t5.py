"""Pretraining objectives of the T5 paper as seqio preprocessors.

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

import numpy as np
import seqio
import tensorflow as tf

from t5lite.tasks.objectives.common import (
    concat_and_split, feature_vocabulary, map_over_dataset, random_split, random_token_range,
    split_documents)


# ----------------------------------------------------------------------------- lengths


def _mask_counts(tokens_length: int, noise_density: float, mean_noise_span_length: float):
    """(noise tokens, noise spans) random_spans_noise_mask draws for a chunk of tokens_length:
    T5's float32 arithmetic (numpy's float32 product, quotient and half-to-even rounding are
    TF's), so a chunk's counts are known without building the mask."""
    length = max(tokens_length, 2)
    num_noise = int(np.rint(np.float32(length) * np.float32(noise_density)))
    num_noise = min(max(num_noise, 1), length - 1)
    num_spans = int(np.rint(np.float32(num_noise) / np.float32(mean_noise_span_length)))
    return num_noise, max(num_spans, 1)


def random_spans_helper(inputs_length: int = 512, noise_density: float = 0.15,
                        mean_noise_span_length: float = 3.0,
                        extra_tokens_per_span_inputs: int = 1,
                        extra_tokens_per_span_targets: int = 1) -> tuple[int, int]:
    """(tokens_length, targets_length) for span corruption with ``inputs_length`` inputs: T5's
    helper (t5.data.preprocessors.random_spans_helper), number for number.

    tokens_length is the longest uncorrupted chunk whose corrupted inputs (kept tokens, one
    sentinel per span, EOS) still fit in inputs_length; targets_length is what its targets need
    (noise tokens, one sentinel per span, EOS). 512 at 0.15 / 3.0 gives (568, 114), the paper's
    setting.

    Kept as T5 wrote it, so the chunks (and with random_spans_noise_mask the examples) are
    T5's: it counts in float64 and without the mask's clamps (at least one noise span), while
    the mask counts in float32, and at density 0.5 it takes one off both lengths without
    recounting.
    So a full chunk can need a token or two more than promised (inputs 172 at 0.15 / 3: a
    190-token chunk, float64 28.4999... -> 28 noise tokens here, float32 28.500002 -> 29 in the
    mask, 40 targets for 38) and seqio's trim drops them; span_surplus says by how much for one
    setting and span_trim_rate how often over a grid (measured in bench/RESULTS.md).
    """
    def lengths(tokens_length):
        num_noise = int(round(tokens_length * noise_density))
        num_spans = int(round(num_noise / mean_noise_span_length))
        return (tokens_length - num_noise + num_spans * extra_tokens_per_span_inputs + 1,
                num_noise + num_spans * extra_tokens_per_span_targets + 1)

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    chunk_inputs, targets_length = lengths(tokens_length)
    # T5's "minor hack" for symmetry: compared with the chunk's inputs, not the requested length.
    if noise_density == 0.5 and targets_length > chunk_inputs:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def span_surplus(inputs_length: int, noise_density: float = 0.15,
                 mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """(inputs, targets) tokens, EOS included, by which a full chunk's span-corrupted example
    exceeds inputs_length and random_spans_helper's targets_length; > 0: seqio trims that many
    real tokens off every full chunk (the counts do not depend on the seeds), < 0: padding."""
    tokens_length, targets_length = random_spans_helper(
        inputs_length, noise_density, mean_noise_span_length)
    num_noise, num_spans = _mask_counts(tokens_length, noise_density, mean_noise_span_length)
    return (tokens_length - num_noise + num_spans + 1 - inputs_length,
            num_noise + num_spans + 1 - targets_length)


def span_trim_rate(settings) -> dict:
    """How often seqio trims span corruption's full chunks over ``settings``, an iterable of
    (inputs_length, noise_density, mean_noise_span_length): the number of settings, the
    fractions whose inputs / targets are trimmed, and the most tokens trimmed off either."""
    surplus = np.array([span_surplus(*s) for s in settings], dtype=np.int64).reshape(-1, 2)
    trimmed = surplus > 0
    return {"settings": len(surplus), "inputs_trimmed": float(trimmed[:, 0].mean()),
            "targets_trimmed": float(trimmed[:, 1].mean()),
            "max_tokens_trimmed": int(max(surplus.max(), 0))}


# ----------------------------------------------------------------------------- noise masks


def _random_segmentation(num_items, num_segments, seed):
    """Lengths of a uniformly random partition of num_items into num_segments non-empty parts."""
    first_in_segment = tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32)
    first_in_segment = tf.pad(seqio.utils.stateless_shuffle(first_in_segment, seed), [[1, 0]])
    segment_id = tf.cumsum(first_in_segment)
    return tf.math.unsorted_segment_sum(tf.ones_like(segment_id), segment_id, num_segments)


def random_spans_noise_mask(length, noise_density, seeds, mean_noise_span_length=3.0):
    """Bool [length] mask of noise spans; spans alternate non-noise / noise, non-noise first.

    T5's mask bit for bit (same seeds, same bits): round(length * noise_density) noise tokens
    in round(num_noise / mean_noise_span_length) spans, both exact per example and counted in
    float32 as T5 does (_mask_counts), not the float64 of random_spans_helper. ``seeds``: two
    stateless seeds.
    """
    if noise_density == 0.0:
        return tf.zeros([length], tf.bool)
    orig_length = length
    length = tf.maximum(length, 2)
    num_noise = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
    num_noise = tf.clip_by_value(num_noise, 1, length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length),
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
    vocabulary = feature_vocabulary(output_features)
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
            spans = _mask_counts(tokens_length, noise_density, mean_noise_span_length)[1]
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
        inputs, targets = random_split(features["targets"], seed)
        return {"inputs": inputs, "targets": targets}

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
    eos = feature_vocabulary(output_features).eos_id

    def concat(x):
        t = x["targets"]
        return {"targets": tf.concat([x["inputs"], tf.constant([eos], t.dtype), t], 0)}

    return dataset.map(concat, num_parallel_calls=tf.data.AUTOTUNE)


def full_lm(dataset, output_features, sequence_length=None):
    """Decoder LM: chunks of targets_length - 1 tokens (EOS after each document, and one more
    appended per chunk by append_eos_after_trim)."""
    length = ((sequence_length or {}).get("targets") or 512) - 1
    eos = feature_vocabulary(output_features).eos_id
    return concat_and_split(dataset, length, separator_id=eos)
