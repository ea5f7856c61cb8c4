"""Feature converters: task features -> the model batch keys of CONTRACTS.md, per architecture.

seqio's converters serve encoder-decoder, decoder LM and prefix LM as they are. The BERT
converter is ours: seqio's EncoderFeatureConverter derives loss weights from ``inputs == mask``,
which misses BERT's 10% random / 10% kept tokens, and it has no token types or per-example labels.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import seqio
import tensorflow as tf

from t5lite.errors import UserError

_Spec = seqio.FeatureConverter.FeatureSpec
# SpanBERT's SBO features (objectives.span_mlm): boundary positions and offset in the span
SPAN_EXTRAS = ("span_left", "span_right", "span_offset")
SEQUENCE_EXTRAS = ("loss_weights", "token_type_ids") + SPAN_EXTRAS  # aligned with inputs
EXAMPLE_EXTRAS = ("nsp_labels", "class_labels")  # one int per example: no packing
_MODEL_NAMES = {"loss_weights": "encoder_loss_weights",
                "token_type_ids": "encoder_token_type_ids",
                **{f: f"encoder_{f}" for f in SPAN_EXTRAS}}


class EncoderFeatureConverter(seqio.FeatureConverter):
    """BERT-style encoder: ``inputs`` [+ ``targets``, ``loss_weights``, ``token_type_ids``,
    ``nsp_labels``, ``class_labels``] -> encoder_* keys.

    ``targets`` and ``loss_weights`` come as a pair (MLM: loss only where loss_weights is 1);
    without them (classification finetuning) encoder_target_tokens = inputs with zero weights.
    """

    TASK_FEATURES = {"inputs": _Spec(dtype=tf.int32)}
    MODEL_FEATURES = {"encoder_input_tokens": _Spec(dtype=tf.int32),
                      "encoder_target_tokens": _Spec(dtype=tf.int32),
                      "encoder_loss_weights": _Spec(dtype=tf.int32)}
    PACKING_FEATURE_DTYPES = {"encoder_segment_ids": tf.int32, "encoder_positions": tf.int32}

    def __init__(self, task_features: Sequence[str] = ("inputs", "targets", "loss_weights"),
                 pack: bool = True, **kwargs):
        self.features = tuple(f for f in ("inputs", "targets") + SEQUENCE_EXTRAS + EXAMPLE_EXTRAS
                              if f in task_features)
        if ("targets" in self.features) != ("loss_weights" in self.features):
            raise UserError("an encoder (BERT) task needs both `targets` and `loss_weights` "
                            "(e.g. the bert_mlm preprocessor) or neither (classification).")
        labels = [f for f in EXAMPLE_EXTRAS if f in self.features]
        if pack and labels:
            raise UserError(f"the task has per-example {', '.join(labels)}, which packing "
                            "cannot keep; set data.pack=False (BERT pairs already fill a row).")
        self.TASK_FEATURES = {f: _Spec(dtype=tf.int32, rank=0 if f in EXAMPLE_EXTRAS else 1)
                              for f in self.features}
        self.MODEL_FEATURES = dict(EncoderFeatureConverter.MODEL_FEATURES)
        for f in self.features:
            if f in SEQUENCE_EXTRAS[1:]:
                self.MODEL_FEATURES[_MODEL_NAMES[f]] = _Spec(dtype=tf.int32)
            elif f in EXAMPLE_EXTRAS:
                self.MODEL_FEATURES[f] = _Spec(dtype=tf.int32, rank=0)
        super().__init__(pack=pack, **kwargs)

    def task_lengths(self, inputs_length: int) -> dict:
        """Task feature lengths for all features from the one inputs length."""
        return {f: 1 if f in EXAMPLE_EXTRAS else inputs_length for f in self.features}

    def _convert_features(self, ds, task_feature_lengths):
        sequence_lengths = {k: v for k, v in task_feature_lengths.items()
                            if k not in EXAMPLE_EXTRAS}
        shifted = [k for k in SEQUENCE_EXTRAS if k in sequence_lengths] if self.pack else []
        # seqio's packer measures each feature by its non-zero entries, so 0/1 features
        # travel as 1/2 and come back after packing (padding stays 0).
        ds = ds.map(lambda x: {k: v + 1 if k in shifted else v for k, v in x.items()})
        ds = self._pack_or_pad(ds, sequence_lengths)
        ds = ds.map(lambda x: {k: tf.maximum(v - 1, 0) if k in shifted else v
                               for k, v in x.items()})

        def convert(x):
            d = {"encoder_input_tokens": x["inputs"],
                 "encoder_target_tokens": x.get("targets", x["inputs"]),
                 "encoder_loss_weights": x.get("loss_weights", tf.zeros_like(x["inputs"]))}
            if "token_type_ids" in x:
                d["encoder_token_type_ids"] = x["token_type_ids"]
            if "span_offset" in x:
                # boundaries are positions in the example; packed, it starts at i - position_i
                start = (tf.range(tf.shape(x["inputs"])[0]) - x["inputs_positions"]
                         if self.pack else 0)
                for f in ("span_left", "span_right"):
                    d[_MODEL_NAMES[f]] = tf.where(x["span_offset"] > 0, x[f] + start, 0)
                d["encoder_span_offset"] = x["span_offset"]
            for f in EXAMPLE_EXTRAS:
                if f in x:
                    d[f] = x[f]
            if self.pack:
                d["encoder_segment_ids"] = x["inputs_segment_ids"]
                d["encoder_positions"] = x["inputs_positions"]
            return d

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]):
        length = task_feature_lengths["inputs"]
        out = {k: (1 if k in EXAMPLE_EXTRAS else length) for k in self.MODEL_FEATURES}
        if self.pack:
            out.update(encoder_segment_ids=length, encoder_positions=length)
        return out


class _DropKeys(seqio.FeatureConverter):
    """A seqio converter with some model features removed (decoder-only reading a task with
    inputs: PrefixLM layout, loss on targets only, causal attention everywhere)."""

    TASK_FEATURES = seqio.PrefixLMFeatureConverter.TASK_FEATURES
    PACKING_FEATURE_DTYPES = seqio.PrefixLMFeatureConverter.PACKING_FEATURE_DTYPES

    def __init__(self, inner: seqio.FeatureConverter, drop: Sequence[str]):
        self._inner, self._drop = inner, tuple(drop)
        self.MODEL_FEATURES = {k: v for k, v in inner.MODEL_FEATURES.items() if k not in drop}
        super().__init__(pack=inner.pack)

    def _convert_features(self, ds, task_feature_lengths):
        ds = self._inner._convert_features(  # pylint: disable=protected-access
            ds, task_feature_lengths)
        return ds.map(lambda x: {k: v for k, v in x.items() if k not in self._drop})

    def get_model_feature_lengths(self, task_feature_lengths):
        lengths = self._inner.get_model_feature_lengths(task_feature_lengths)
        return {k: v for k, v in lengths.items() if k not in self._drop}


class _AddCausalAttention(seqio.FeatureConverter):
    """prefix_lm architecture on a targets-only task: an empty prefix (all zeros)."""

    TASK_FEATURES = seqio.LMFeatureConverter.TASK_FEATURES
    PACKING_FEATURE_DTYPES = seqio.LMFeatureConverter.PACKING_FEATURE_DTYPES
    MODEL_FEATURES = {**seqio.LMFeatureConverter.MODEL_FEATURES,
                      "decoder_causal_attention": _Spec(dtype=tf.int32)}

    def __init__(self, pack=True):
        self._inner = seqio.LMFeatureConverter(pack=pack)
        super().__init__(pack=pack)

    def _convert_features(self, ds, task_feature_lengths):
        ds = self._inner._convert_features(  # pylint: disable=protected-access
            ds, task_feature_lengths)
        return ds.map(lambda x: {**x, "decoder_causal_attention":
                                 tf.zeros_like(x["decoder_target_tokens"])})

    def get_model_feature_lengths(self, task_feature_lengths):
        lengths = dict(self._inner.get_model_feature_lengths(task_feature_lengths))
        lengths["decoder_causal_attention"] = lengths["decoder_target_tokens"]
        return lengths


ARCHITECTURES = ("encoder_decoder", "decoder_only", "prefix_lm", "encoder_only")


def make_converter(architecture: str, task_features: Sequence[str], pack: bool = True,
                   task_name: str = "") -> seqio.FeatureConverter:
    """The converter for ``architecture`` given the features the task produces."""
    has_inputs, has_targets = "inputs" in task_features, "targets" in task_features
    what = f"task {task_name!r}" if task_name else "the task"
    if "class_labels" in task_features and architecture in ("decoder_only", "prefix_lm"):
        from t5lite.tasks.classification import DecoderClassificationConverter
        return DecoderClassificationConverter(pack=pack)  # GPT classification head
    if architecture == "encoder_decoder":
        if not (has_inputs and has_targets):
            raise UserError(f"{what} has no inputs/targets pair, which encoder_decoder needs; "
                            "use e.g. corpus_span_corruption, or a decoder_only model for LM.")
        return seqio.EncDecFeatureConverter(pack=pack)
    if architecture == "decoder_only":
        if not has_targets:
            raise UserError(f"{what} has no targets; decoder_only needs e.g. corpus_lm.")
        if has_inputs:
            return _DropKeys(seqio.PrefixLMFeatureConverter(pack=pack),
                             ["decoder_causal_attention"])
        return seqio.LMFeatureConverter(pack=pack)
    if architecture == "prefix_lm":
        if not has_targets:
            raise UserError(f"{what} has no targets; prefix_lm needs e.g. corpus_prefix_lm.")
        if has_inputs:
            return seqio.PrefixLMFeatureConverter(pack=pack)
        return _AddCausalAttention(pack=pack)
    if architecture == "encoder_only":
        if has_targets and "loss_weights" not in task_features:
            raise UserError(f"{what} is not an encoder (BERT) task (no loss_weights); use "
                            "corpus_mlm, corpus_mlm_only or a *_cls classification task.")
        return EncoderFeatureConverter(task_features, pack=pack)
    raise UserError(f"unknown architecture {architecture!r}; one of {', '.join(ARCHITECTURES)}.")
