"""BERT's pretraining data (Devlin et al. 2019): [CLS] A [SEP] B [SEP] rows with next sentence
prediction, [CLS] chunk [SEP] rows without it, and masked LM (80% [MASK] / 10% random / 10%
kept)."""

from __future__ import annotations

import tensorflow as tf

from t5lite.tasks.objectives.common import (
    bert_special_ids, concat_and_split, map_over_dataset, random_split, random_token_range)


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
        a, b = random_split(features["inputs"], seed)
        return {"a": a, "b": b}

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
