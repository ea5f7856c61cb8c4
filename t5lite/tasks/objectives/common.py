"""Helpers every objective family shares: the vocabulary of the output features, chunking a
token stream or a document, keeping a token budget, the special ids ([CLS] / [SEP] / [MASK] or
the sentinels standing in for them), the range of ordinary tokens for random replacement, and
which ids begin a word."""

from __future__ import annotations

from typing import Optional

import numpy as np
import seqio
import tensorflow as tf

from t5lite.errors import UserError

map_over_dataset = seqio.map_over_dataset


def feature_vocabulary(output_features, key="targets"):
    """The vocabulary of feature ``key``, else of ``inputs``."""
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


def random_split(tokens, seed):
    """tokens -> (tokens[:k], tokens[k:]) at a point k drawn uniformly from 1 .. len - 1 (both
    parts non-empty for len >= 2): BERT's sentence pair, the paper's prefix LM."""
    k = tf.random.stateless_uniform([], seed=seed, minval=1, maxval=tf.size(tokens),
                                    dtype=tf.int32)
    return tokens[:k], tokens[k:]


def limit_tokens(dataset: tf.data.Dataset, max_tokens: int, key: str = "targets"):
    """Keep the first examples until ``max_tokens`` tokens (the paper's Table 9 data sizes;
    the training pipeline repeats the result)."""
    def step(total, ex):
        total += tf.cast(tf.size(ex[key]), tf.int64)
        return total, (total, ex)
    ds = dataset.scan(tf.constant(0, tf.int64), step)
    ds = ds.take_while(lambda total, ex: total <= max_tokens)
    return ds.map(lambda total, ex: ex)



# ----------------------------------------------------------------------------- special ids


def bert_special_ids(vocabulary) -> dict:
    """[CLS], [SEP], [MASK] ids. A WordPiece vocabulary exposes cls_id / sep_id / mask_id; for a
    SentencePiece vocabulary the last sentinels stand in (mask = <extra_id_0>)."""
    top = vocabulary.vocab_size - 1
    return {"cls": getattr(vocabulary, "cls_id", top - 1),
            "sep": getattr(vocabulary, "sep_id", top - 2),
            "mask": getattr(vocabulary, "mask_id", top)}



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



def word_starts(vocabulary):
    """Bool numpy [vocab_size]: True where an id begins a word. SentencePiece: pieces starting
    with "▁" (plus control / unknown ids and sentinels); BERT WordPiece: every entry not
    starting with "##". Other vocabularies may define ``word_starts()`` themselves."""
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
        raise UserError(f"span masking needs word boundaries: use a SentencePiece or BERT "
                        f"WordPiece vocabulary (got {type(vocabulary).__name__}), or give it "
                        "a word_starts() method.")
    out = np.ones([vocabulary.vocab_size], bool)  # sentinels / padding ids: whole words
    out[:len(table)] = table[:vocabulary.vocab_size]
    return out
