"""SpanBERT's span masking (Joshi et al. 2020): whole-word spans with geometric lengths, and
the span boundary features its SBO head reads."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from t5lite.tasks.objectives.common import (
    bert_special_ids, map_over_dataset, random_token_range, word_starts)


def span_length_probs(geometric_p: float = 0.2, max_span_words: int = 10):
    """P(span = l words), l = 1..max_span_words: Geo(p) truncated at the maximum and
    renormalised, as SpanBERT's code does (mean 3.8 words at p = 0.2, the paper's figure;
    piling the tail onto the maximum instead would give 4.5)."""
    lengths = np.arange(1, max_span_words + 1)
    w = geometric_p * (1.0 - geometric_p) ** (lengths - 1)
    return w / w.sum()



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
