"""t5lite's tasks and mixtures, registered with seqio's TaskRegistry / MixtureRegistry.

Registering reads nothing from disk: the files under the data dir (dataprep.data_dir()) are
located when a dataset is built, and a missing file raises UserError naming the
`t5lite data prepare NAME` command that builds it.

The register_* functions build one task or mixture each; which built-in tasks exist is
t5lite/task_catalog.py's data, registered by tasks/builtin.py. OBJECTIVE_STEPS holds each
pretraining objective's preprocessors (its feature layout is in task_catalog.OBJECTIVE_LAYOUTS).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Callable, Mapping, Optional, Sequence, Union

import seqio
import tensorflow as tf

from t5lite import dataprep, task_catalog
from t5lite.errors import UserError
from t5lite.tasks import metrics, objectives

TaskRegistry, MixtureRegistry = seqio.TaskRegistry, seqio.MixtureRegistry
DEFAULT_VOCAB = task_catalog.DEFAULT_VOCAB
VOCAB_SUFFIX = task_catalog.VOCAB_SUFFIX


# ----------------------------------------------------------------------------- sources


class _LocalPaths(Mapping):
    """split -> file under the data dir, resolved when read (so the data dir can change)."""

    def __init__(self, dataset: str, split_to_relpath: Mapping[str, str]):
        self._dataset, self._rel = dataset, dict(split_to_relpath)

    def __getitem__(self, split):
        return dataprep.require(self._dataset, self._rel[split])

    def __iter__(self):
        return iter(self._rel)

    def __len__(self):
        return len(self._rel)


class LocalTextLineSource(seqio.TextLineDataSource):
    """seqio.TextLineDataSource over prepared files, located lazily; counts its lines for
    examples-proportional mixing."""

    def __init__(self, dataset: str, split_to_relpath: Mapping[str, str]):
        super().__init__(split_to_filepattern=_LocalPaths(dataset, split_to_relpath))
        self._counts = {}

    def num_input_examples(self, split: str) -> int:
        path = self._split_to_filepattern[split]
        key = (path, os.path.getmtime(path))
        if key not in self._counts:
            with open(path, "rb") as f:
                self._counts[key] = sum(1 for _ in f)
        return self._counts[key]


def corpus_source() -> LocalTextLineSource:
    return LocalTextLineSource("corpus", {s: f"corpus/{s}.txt" for s in ("train", "validation")})


def finetune_source(name: str) -> LocalTextLineSource:
    return LocalTextLineSource(name, {s: f"finetune/{name}/{s}.tsv"
                                      for s in ("train", "validation", "test")})


# ----------------------------------------------------------------------------- preprocessors


@seqio.map_over_dataset
def line_to_text(line):
    """A TextLineDataSource line -> {"text": line}."""
    return {"text": line}


def parse_tsv(dataset, field_names=("inputs", "targets")):
    """``input\\ttarget`` lines (the prepared finetuning files) -> a dict of strings named
    ``field_names`` (one per tab-separated column: inputs, targets unless given)."""
    def parse(line):
        fields = tf.io.decode_csv(line, record_defaults=[""] * len(field_names),
                                  field_delim="\t", use_quote_delim=False)
        return dict(zip(field_names, fields))
    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def jsonl_problem(line: bytes, keys: Sequence[str]) -> str:
    """Why parse_jsonl cannot read this line ("" when it can)."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        return f"is not JSON ({getattr(e, 'msg', e)})"
    if not isinstance(obj, dict):
        return "is not a JSON object"
    missing = [k for k in keys if k not in obj]
    if missing:
        return f"has no key {', '.join(map(repr, missing))} (it has {', '.join(obj) or 'none'})"
    bad = [k for k in keys if not isinstance(obj[k], (str, int, float, bool))]
    if bad:
        return f"holds no text or number under {', '.join(map(repr, bad))}"
    return ""


def _jsonl_fields(line, keys):
    """A JSONL line -> the text of each key (a number or true / false as JSON writes it)."""
    why = jsonl_problem(line, keys)
    if why:
        raise ValueError(f"JSONL line {line[:200]!r} {why}")
    obj = json.loads(line)
    return [v if isinstance(v := obj[k], str) else json.dumps(v) for k in keys]


def parse_jsonl(dataset, field_names=("inputs", "targets"), json_keys=None):
    """JSON-lines (one object per line, e.g. {"inputs": "...", "targets": "..."}) -> a dict of
    strings named ``field_names``, read from the keys ``json_keys`` (default: the same
    names); a number or true / false becomes its JSON text. The JSONL twin of parse_tsv."""
    keys = tuple(json_keys or field_names)
    if len(keys) != len(field_names):
        raise UserError(f"parse_jsonl: json_keys {keys} and field_names {tuple(field_names)} "
                        "must have the same length (one JSON key per field).")

    def parse(line):
        fields = tf.numpy_function(lambda x: _jsonl_fields(x, keys), [line],
                                   [tf.string] * len(keys), stateful=False)
        return {name: tf.ensure_shape(f, []) for name, f in zip(field_names, fields)}
    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def add_prefix(dataset, prefix: str, key: str = "inputs"):
    """Prepend the text-to-text task prefix, e.g. "sst2 sentence: "."""
    return dataset.map(lambda x: {**x, key: tf.strings.join([prefix, x[key]], " ")},
                       num_parallel_calls=tf.data.AUTOTUNE)


def text_label_to_class_id(dataset, label_names: Sequence[str], key: str = "targets"):
    """A label name -> ``class_labels`` (its index), for classification heads."""
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(list(label_names)), tf.range(len(label_names), dtype=tf.int32)), -1)
    return dataset.map(lambda x: {k: v for k, v in {**x, "class_labels": table.lookup(x[key])}
                                  .items() if k != key})


def bert_wrap(dataset, output_features, sequence_length=None):
    """[CLS] inputs [SEP] (inputs already tokenized; trimmed to fit)."""
    special = objectives.bert_special_ids(output_features["inputs"].vocabulary)
    length = (sequence_length or {}).get("inputs") or 512

    def wrap(x):
        t = x["inputs"][:length - 2]
        return {**x, "inputs": tf.concat([tf.constant([special["cls"]], t.dtype), t,
                                          tf.constant([special["sep"]], t.dtype)], 0)}
    return dataset.map(wrap, num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- features


def _vocabulary(vocab: Union[str, seqio.Vocabulary]) -> seqio.Vocabulary:
    if isinstance(vocab, seqio.Vocabulary):
        return vocab
    from t5lite.tasks import vocabularies
    return vocabularies.get_vocabulary(vocab)


def _int_feature(rank: int = 1) -> seqio.Feature:
    return seqio.Feature(seqio.PassThroughVocabulary(size=0), add_eos=False, dtype=tf.int32,
                         rank=rank)


def text_features(vocab, inputs=True, inputs_eos=True) -> dict:
    feats = {"targets": seqio.Feature(vocab, add_eos=True)}
    if inputs:
        feats = {"inputs": seqio.Feature(vocab, add_eos=inputs_eos), **feats}
    return feats


def bert_features(vocab, nsp: bool = False, mlm: bool = True, classes: bool = False,
                  spans: bool = False) -> dict:
    feats = {"inputs": seqio.Feature(vocab, add_eos=False)}
    if mlm:
        feats.update(targets=seqio.Feature(vocab, add_eos=False), loss_weights=_int_feature())
    if spans:  # SpanBERT's span boundary features (objectives.span_mlm)
        feats.update({k: _int_feature() for k in ("span_left", "span_right", "span_offset")})
    if nsp:
        feats.update(token_type_ids=_int_feature(), nsp_labels=_int_feature(rank=0))
    if classes:
        feats.update(class_labels=_int_feature(rank=0))
    return feats


# ----------------------------------------------------------------------------- pretraining


# objective name -> (preprocessors after tokenization, description); the layout of its
# features is task_catalog.OBJECTIVE_LAYOUTS[name]
OBJECTIVE_STEPS = {
    "span_corruption": ([objectives.span_corruption],
                        "T5 span corruption, 15% noise, mean span 3 (paper's final choice)"),
    "iid_denoising": ([objectives.iid_denoising],
                      "i.i.d. 15% noise, each corrupted span -> one sentinel (paper baseline)"),
    "bert_denoising": ([objectives.bert_style_denoising],
                       "BERT-style (the paper's): 15% of tokens, 90% mask / 10% random; "
                       "target = original text"),
    "mass_denoising": ([objectives.mass_style_denoising],
                       "MASS-style: 15% of tokens -> mask; target = original text"),
    "drop_tokens": ([objectives.drop_tokens], "drop 15% of tokens; target = the dropped tokens"),
    "deshuffling": ([objectives.deshuffling], "shuffled tokens -> original order"),
    "prefix_lm": ([objectives.prefix_lm], "random split: prefix -> continuation"),
    "lm": ([objectives.full_lm], "decoder language modelling"),
    "iid_denoising_lm": ([objectives.iid_denoising_lm],
                         "i.i.d. 15% denoising as one sequence (inputs EOS targets) for a "
                         "decoder-only LM, loss on all of it"),
    "mlm": ([functools.partial(objectives.bert_pairs, nsp=True), objectives.bert_mlm],
            "BERT: MLM (15%, 80/10/10) + next sentence prediction"),
    "mlm_only": ([objectives.bert_single, objectives.bert_mlm],
                 "BERT MLM (15%, 80/10/10) without NSP, packable"),
    # BART's noising (Lewis et al. 2019, Section 2.2); target = the original chunk
    **{f"bart_{name}": ([functools.partial(objectives.bart_denoising, noises=noises)],
                        f"BART {text}; target = original text")
       for name, noises, text in (
           ("infilling", ("infilling",), "text infilling: 30% of tokens in Poisson(3) spans, "
                                         "each span -> one mask"),
           ("permutation", ("permutation",), "sentence permutation (split on full stops)"),
           ("deletion", ("deletion",), "token deletion: 30% of tokens deleted"),
           ("rotation", ("rotation",), "document rotation: starts at a random token"),
           ("masking", ("masking",), "token masking: 30% of tokens -> mask"),
           ("infilling_permutation", ("permutation", "infilling"),
            "text infilling + sentence permutation (the paper's final model)"))},
    "spanbert": ([objectives.bert_single, objectives.span_mlm],
                 "SpanBERT: whole-word spans (Geo(0.2) <= 10 words) to 15%, 80/10/10 per "
                 "span, boundary features for SBO; no NSP, packable"),
}


def register_pretraining_task(name: str, objective: str = "span_corruption",
                              vocabulary: Union[str, seqio.Vocabulary] = DEFAULT_VOCAB,
                              max_tokens: Optional[int] = None,
                              source: Optional[seqio.DataSource] = None,
                              from_lines: bool = True,
                              **objective_kwargs) -> seqio.Task:
    """A corpus task with one objective; ``objective_kwargs`` set its parameters (e.g.
    noise_density=0.5, mean_noise_span_length=10, inputs_fn=...: any row of the paper's
    Tables 3-5); ``max_tokens`` keeps only that many corpus tokens (Table 7)."""
    if objective not in OBJECTIVE_STEPS:
        raise UserError(f"unknown objective {objective!r}; one of "
                        f"{', '.join(OBJECTIVE_STEPS)}.")
    steps, _ = OBJECTIVE_STEPS[objective]
    layout = task_catalog.OBJECTIVE_LAYOUTS[objective]
    if objective_kwargs:
        steps = [functools.partial(steps[0], **objective_kwargs)] + steps[1:]
    vocab = _vocabulary(vocabulary)
    key = "inputs" if layout.startswith("bert") else "targets"
    features = {"encdec": lambda: text_features(vocab),
                "prefix": lambda: text_features(vocab, inputs_eos=False),
                "lm": lambda: text_features(vocab, inputs=False),
                "bert": lambda: bert_features(vocab),
                "bert_nsp": lambda: bert_features(vocab, nsp=True),
                "bert_span": lambda: bert_features(vocab, spans=True)}[layout]()
    # from_lines=False: the source already gives {"text": ...} (e.g. TFDS c4/en)
    pre = ([line_to_text] if from_lines else []) + [
        functools.partial(seqio.preprocessors.rekey, key_map={key: "text"}),
        seqio.preprocessors.tokenize]
    if max_tokens:
        pre.append(functools.partial(objectives.limit_tokens, max_tokens=max_tokens, key=key))
    pre.append(seqio.CacheDatasetPlaceholder())  # `t5lite data cache`: tokenized text, once
    pre += list(steps)
    if not layout.startswith("bert"):
        pre.append(seqio.preprocessors.append_eos_after_trim)
    TaskRegistry.remove(name)
    return TaskRegistry.add(name, source=source or corpus_source(), preprocessors=pre,
                            output_features=features, metric_fns=[])


# ----------------------------------------------------------------------------- finetuning

# Shuffle buffer of every finetuning task (text-to-text and classification): the whole train
# split of each local set. The prepared files are ordered (sentiment by label, topic_debian by
# package name); with seqio's default 1000-example buffer the first batches would hold one label
# only and each epoch drift from one label to the other, so finetuning would chase the label
# of the moment.
FINETUNE_SHUFFLE_BUFFER = 2 ** 16


class SplitShuffleTask(seqio.Task):
    """A task whose shuffle buffer is at most its split's example count. seqio repeats a
    training split before shuffling it, so a buffer larger than the split only fills with
    copies of it: each one preprocessed before the first batch, and every window holding
    each example many times (bench/RESULTS.md, "Where the suite's time goes")."""

    def get_dataset(self, sequence_length=None, split="train", use_cached=False, shuffle=True,
                    shuffle_buffer_size=None, **kwargs):
        if shuffle and shuffle_buffer_size is None and not use_cached:
            n = self.source.num_input_examples(split)
            if n:  # unknown (None) or empty: the task's own buffer
                shuffle_buffer_size = min(self._shuffle_buffer_size, n)
        return super().get_dataset(sequence_length, split=split, use_cached=use_cached,
                                   shuffle=shuffle, shuffle_buffer_size=shuffle_buffer_size,
                                   **kwargs)


def add_finetune_task(name: str, **task_kwargs) -> seqio.Task:
    """Registers (replacing) a finetuning task that shuffles its whole train split."""
    TaskRegistry.remove(name)
    return TaskRegistry.add(name, task_cls=SplitShuffleTask,
                            shuffle_buffer_size=FINETUNE_SHUFFLE_BUFFER, **task_kwargs)


# name -> (text-to-text prefix, metric_fns, label names or None)
FINETUNE = {name: (prefix, [getattr(metrics, m) for m in metric_names], labels)
            for name, (prefix, metric_names, labels) in task_catalog.FINETUNE.items()}


def register_finetune_task(name: str, dataset: str, prefix: str,
                           metric_fns: Sequence[Callable] = (metrics.accuracy,),
                           vocabulary: Union[str, seqio.Vocabulary] = DEFAULT_VOCAB,
                           source: Optional[seqio.DataSource] = None) -> seqio.Task:
    """Text-to-text task over finetune/DATASET/*.tsv: "PREFIX input" -> target."""
    vocab = _vocabulary(vocabulary)
    return add_finetune_task(
        name, source=source or finetune_source(dataset),
        preprocessors=[parse_tsv, functools.partial(add_prefix, prefix=prefix),
                       seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
                       seqio.preprocessors.append_eos_after_trim],
        output_features=text_features(vocab), metric_fns=list(metric_fns))


def register_classification_task(name: str, dataset: str, label_names: Sequence[str],
                                  vocabulary: Union[str, seqio.Vocabulary] = DEFAULT_VOCAB,
                                  source: Optional[seqio.DataSource] = None) -> seqio.Task:
    """[CLS] input [SEP] -> class_labels (encoder-only classification finetuning)."""
    vocab = _vocabulary(vocabulary)
    return add_finetune_task(
        name, source=source or finetune_source(dataset),
        preprocessors=[parse_tsv,
                       functools.partial(text_label_to_class_id, label_names=label_names),
                       seqio.preprocessors.tokenize, bert_wrap],
        output_features=bert_features(vocab, mlm=False, classes=True),
        metric_fns=[metrics.accuracy])


# ----------------------------------------------------------------------------- mixtures


def examples_proportional(cap: int = 2 ** 16, temperature: float = 1.0):
    """The paper's examples-proportional rate min(N, K), optionally ** (1 / T)."""
    return functools.partial(seqio.mixing_rate_num_examples, maximum=cap,
                             temperature=temperature)


def rate_function(rate: str, cap: int = 2 ** 16, temperature: float = 2.0):
    """A named mixing rate as seqio takes it: a function of the task, or a number."""
    if rate == "proportional":
        return examples_proportional(cap)
    if rate == "temperature":
        return examples_proportional(cap, temperature)
    if rate == "equal":
        return 1.0
    raise UserError(f"mixture rate {rate!r}: use proportional, temperature or equal.")


def register_mixture(name: str, tasks: Sequence[str], rate: Union[str, float, Callable] =
                     "proportional", cap: int = 2 ** 16, temperature: float = 2.0):
    """rate: "proportional" (min(N, cap)), "temperature" (min(N, cap) ** (1/T)), "equal",
    a number, or a seqio rate function of the task."""
    fn = rate if callable(rate) or isinstance(rate, (int, float)) else rate_function(
        rate, cap, temperature)
    MixtureRegistry.remove(name)
    return MixtureRegistry.add(name, [(t, fn) for t in tasks])
