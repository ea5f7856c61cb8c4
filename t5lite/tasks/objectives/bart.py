"""BART's noising functions (Lewis et al. 2019, Section 2.2) for the encoder-decoder models.

The inputs are a corrupted chunk, the targets the chunk itself. Each noise maps a 1-D token
tensor and two stateless seeds to the corrupted tokens; ``bart_denoising`` chains them.
Semantics follow fairseq's denoising_dataset.py where the paper is silent, with the
differences said at each function.
"""

from __future__ import annotations

from typing import Optional

import seqio
import tensorflow as tf

from t5lite.errors import UserError
from t5lite.tasks.objectives.common import (
    bert_special_ids, concat_and_split, feature_vocabulary, map_over_dataset, split_documents)


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
        raise UserError(f"unknown BART noise {unknown or noises}; use any of "
                        f"{', '.join(BART_NOISES)}.")
    if any(n in ("infilling", "masking", "deletion") for n in noises):
        _check_rate(rate)
    vocabulary = feature_vocabulary(output_features)
    length = tokens_length or ((sequence_length or {}).get("inputs") or 512) - 1
    if split == "stream":
        dataset = concat_and_split(dataset, length)
    elif split == "documents":
        dataset = split_documents(dataset, length)
    else:
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
