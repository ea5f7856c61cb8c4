"""Data for models with task heads (models/architectures.py), beyond BERT's [CLS] tasks in
registry.py: sequence classification for decoder-only (GPT) models, and the BIO-tagging rule
"label the first sub-token of each word".

- ``sentiment_cls_gpt2``: "text<|endoftext|>" -> decoder_input_tokens / decoder_segment_ids /
  decoder_positions + class_labels; DecoderOnly pools its last non-padding token (the eos).
  Padding is marked by segment id 0, never by token id (GPT-2's id 0 is "!").
- ``first_subtoken_labels``: word-level tags -> token_labels / token_label_weights for the
  token-classification head (loss only on each word's first sub-token, as in BERT's NER).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np
import seqio
import tensorflow as tf

from t5lite.errors import UserError
from t5lite.tasks import metrics, registry

_Spec = seqio.FeatureConverter.FeatureSpec


class DecoderClassificationConverter(seqio.FeatureConverter):
    """``targets`` (the text) + ``class_labels`` -> decoder-only classification batches.

    The text is fed unshifted (no LM loss): the last real position has read every token.
    Unpacked only: a row holds one example, as pooling the last token needs.
    """

    TASK_FEATURES = {"targets": _Spec(dtype=tf.int32)}
    MODEL_FEATURES = {"decoder_input_tokens": _Spec(dtype=tf.int32),
                      "decoder_segment_ids": _Spec(dtype=tf.int32),
                      "decoder_positions": _Spec(dtype=tf.int32),
                      "class_labels": _Spec(dtype=tf.int32, rank=0)}
    PACKING_FEATURE_DTYPES = {}

    def __init__(self, pack: bool = False, **kwargs):
        if pack:
            raise UserError("decoder-only classification pools one example per row; set "
                            "data.pack=False.")
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds, task_feature_lengths):
        length = task_feature_lengths["targets"]
        ds = ds.map(lambda x: {**x, "real": tf.ones_like(x["targets"])})
        ds = self._pack_or_pad(ds, {"targets": length, "real": length})

        def convert(x):
            return {"decoder_input_tokens": x["targets"], "decoder_segment_ids": x["real"],
                    "decoder_positions": tf.range(length, dtype=tf.int32) * x["real"],
                    "class_labels": x["class_labels"]}
        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
        n = task_feature_lengths["targets"]
        return {"decoder_input_tokens": n, "decoder_segment_ids": n, "decoder_positions": n,
                "class_labels": 1}


def _text_as_targets(dataset):
    return dataset.map(lambda x: {"targets": x["inputs"], "class_labels": x["class_labels"]})


def register_decoder_classification_task(name: str, dataset: str, label_names: Sequence[str],
                                         vocabulary="gpt2") -> seqio.Task:
    """TSV ``input\\tlabel`` -> text tokens + eos, class_labels (decoder-only heads)."""
    vocab = registry._vocabulary(vocabulary)  # pylint: disable=protected-access
    return registry.add_finetune_task(
        name, source=registry.finetune_source(dataset),
        preprocessors=[registry.parse_tsv,
                       functools.partial(registry.text_label_to_class_id,
                                         label_names=label_names),
                       _text_as_targets, seqio.preprocessors.tokenize,
                       seqio.preprocessors.append_eos_after_trim],
        output_features={"targets": seqio.Feature(vocab, add_eos=True),
                         "class_labels": seqio.Feature(seqio.PassThroughVocabulary(size=0),
                                                       add_eos=False, dtype=tf.int32, rank=0)},
        metric_fns=[metrics.accuracy])


# ----------------------------------------------------------------------------- tagging


def first_subtoken_labels(words: Sequence[str], word_labels: Sequence[int],
                          tokenize: Callable[[str], Sequence[int]], length: int,
                          cls_id: int, sep_id: int) -> dict:
    """[CLS] sub-tokens of each word [SEP], padded to ``length`` -> int32 arrays
    encoder_input_tokens, token_labels (the word's tag on its first sub-token, 0 elsewhere) and
    token_label_weights (1 on first sub-tokens only). Words that do not fit are dropped whole."""
    tokens, labels, weights = [cls_id], [0], [0]
    for word, label in zip(words, word_labels, strict=True):
        pieces = list(tokenize(word))
        if not pieces or len(tokens) + len(pieces) > length - 1:
            if not pieces:
                continue
            break
        tokens += pieces
        labels += [int(label)] + [0] * (len(pieces) - 1)
        weights += [1] + [0] * (len(pieces) - 1)
    tokens, labels, weights = tokens + [sep_id], labels + [0], weights + [0]
    pad = length - len(tokens)
    as_array = lambda xs: np.asarray(xs + [0] * pad, np.int32)  # noqa: E731
    return {"encoder_input_tokens": as_array(tokens), "token_labels": as_array(labels),
            "token_label_weights": as_array(weights)}
