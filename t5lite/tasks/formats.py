"""The T5 paper's text-to-text formats for GLUE, SuperGLUE, SQuAD, CNN/DailyMail and WMT,
and functions that register seqio tasks from the official files (or from TFDS).

The data is not shipped (and not fetchable here): these are for users who have it on disk.
Every reader turns the official format into TFDS's feature names and label ids, so one text
preprocessor per benchmark serves both the files and TFDS:

  mnli:  {"premise", "hypothesis", "label": 1} -> "mnli hypothesis: ... premise: ..." -> "neutral"
  stsb:  score 3.14 -> "3.2" (rounded to the nearest 0.2, as T5)
  squad: "question: ... context: ..." -> first answer (all answers kept for EM / F1)
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import glob
import json
import os
from typing import Callable, Mapping, Optional, Sequence, Union

import seqio
import tensorflow as tf

from t5lite import task_catalog
from t5lite.errors import UserError
from t5lite.tasks import metrics, registry, superglue

csv.field_size_limit(2 ** 31 - 1)


# ----------------------------------------------------------------------------- benchmarks


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One classification / regression benchmark in T5's format."""

    name: str
    features: tuple  # TFDS feature names, in the text's order (T5's: alphabetical but MultiRC)
    label_names: Optional[tuple]  # None: regression (stsb)
    metric_fns: tuple
    # official file -> TFDS names: column of each feature and of the label (GLUE TSV)
    columns: Optional[Mapping[str, Union[str, int]]] = None
    file_labels: Optional[tuple] = None  # label strings in the file, by TFDS id
    strip_html: bool = False  # MultiRC's paragraphs carry <br> and <b> markup (T5 drops it)


def _glue_metrics(task: str) -> tuple:
    """A benchmark's metrics are named in task_catalog (its paper_glue_* row shows them)."""
    return tuple(metrics.by_name(task_catalog.PAPER_GLUE_METRICS[task]))


def _superglue_metrics(task: str) -> tuple:
    return tuple(metrics.by_name(task_catalog.PAPER_SUPERGLUE_METRICS[task]))


GLUE = {b.name: b for b in [
    Benchmark("cola", ("sentence",), ("unacceptable", "acceptable"),
              _glue_metrics("cola"), {"sentence": 3, "label": 1}),
    Benchmark("sst2", ("sentence",), ("negative", "positive"), _glue_metrics("sst2"),
              {"sentence": "sentence", "label": "label"}),
    Benchmark("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"),
              _glue_metrics("mrpc"),
              {"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"}),
    Benchmark("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"),
              _glue_metrics("qqp"),
              {"question1": "question1", "question2": "question2", "label": "is_duplicate"}),
    Benchmark("stsb", ("sentence1", "sentence2"), None, _glue_metrics("stsb"),
              {"sentence1": "sentence1", "sentence2": "sentence2", "label": "score"}),
    Benchmark("mnli", ("hypothesis", "premise"), ("entailment", "neutral", "contradiction"),
              _glue_metrics("mnli"),
              {"premise": "sentence1", "hypothesis": "sentence2", "label": "gold_label"},
              ("entailment", "neutral", "contradiction")),
    Benchmark("qnli", ("question", "sentence"), ("entailment", "not_entailment"),
              _glue_metrics("qnli"), {"question": "question", "sentence": "sentence",
                                      "label": "label"}, ("entailment", "not_entailment")),
    Benchmark("rte", ("sentence1", "sentence2"), ("entailment", "not_entailment"),
              _glue_metrics("rte"), {"sentence1": "sentence1", "sentence2": "sentence2",
                                     "label": "label"}, ("entailment", "not_entailment")),
    Benchmark("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment"),
              _glue_metrics("wnli"), {"sentence1": "sentence1", "sentence2": "sentence2",
                                      "label": "label"}),
]}
GLUE_FILES = {"train": "train.tsv", "validation": "dev.tsv"}
MNLI_FILES = {"train": "train.tsv", "validation_matched": "dev_matched.tsv",
              "validation_mismatched": "dev_mismatched.tsv"}

SUPERGLUE = {b.name: b for b in [
    Benchmark("boolq", ("passage", "question"), ("False", "True"), _superglue_metrics("boolq")),
    Benchmark("cb", ("hypothesis", "premise"), ("entailment", "contradiction", "neutral"),
              _superglue_metrics("cb"),
              file_labels=("entailment", "contradiction", "neutral")),
    Benchmark("copa", ("choice1", "choice2", "premise", "question"), ("choice1", "choice2"),
              _superglue_metrics("copa")),
    # MultiRC: one example per (question, answer option), the question first so that a long
    # paragraph is what truncation cuts; scored per option (F1a) and per question (EM)
    Benchmark("multirc", ("question", "answer", "paragraph"), ("False", "True"),
              _superglue_metrics("multirc"), strip_html=True),
    Benchmark("rte", ("hypothesis", "premise"), ("entailment", "not_entailment"),
              _superglue_metrics("rte"), file_labels=("entailment", "not_entailment")),
    Benchmark("wic", ("sentence1", "sentence2", "word"), ("False", "True"),
              _superglue_metrics("wic")),
    Benchmark("wsc", ("span1_text", "span2_text", "text"), ("False", "True"),
              _superglue_metrics("wsc")),
]}
# ReCoRD (the eighth SuperGLUE task) is a cloze with entity answers: superglue.record_text;
# the paper's WSC is superglue.wsc_simple_text (these official-file tasks keep True / False)
SUPERGLUE_FILES = {"train": "train.jsonl", "validation": "val.jsonl"}


def _index(x) -> dict:
    """The example's index, flat: "idx", or MultiRC's "idx/paragraph", "idx/question", ..."""
    idx = x.get("idx", -1)
    if isinstance(idx, dict):
        return {f"idx/{k}": tf.cast(v, tf.int32) for k, v in idx.items()}
    return {"idx": tf.cast(idx, tf.int32)}


def text_to_text(dataset, benchmark: Benchmark, prefix: Optional[str] = None):
    """TFDS-style example -> {"inputs": "<task> k1: v1 k2: v2", "targets": label name} (a
    test split's label -1: "<unk>", as T5)."""
    prefix = benchmark.name if prefix is None else prefix

    def fmt(x):
        parts = [prefix]
        for k in benchmark.features:
            parts += [f"{k}:", tf.strings.as_string(x[k]) if x[k].dtype != tf.string else x[k]]
        inputs = tf.strings.join(parts, " ")
        if benchmark.strip_html:
            inputs = tf.strings.regex_replace(inputs, "<br>", " ")
            inputs = tf.strings.regex_replace(inputs, "<(/)?b>", "")
        if benchmark.label_names is None:  # regression: round to 0.2, one decimal
            label = tf.cast(x["label"], tf.float32)
            targets = tf.strings.as_string(tf.round(label * 5.0) / 5.0, precision=1)
        else:
            targets = tf.gather(tf.constant(("<unk>",) + benchmark.label_names),
                                tf.cast(x["label"], tf.int32) + 1)
        return {"inputs": inputs, "targets": targets, **_index(x)}

    return dataset.map(fmt, num_parallel_calls=tf.data.AUTOTUNE)


def postprocessor(benchmark: Benchmark) -> Callable:
    if benchmark.label_names is None:
        return metrics.string_to_float
    if benchmark.name == "multirc":
        return metrics.multirc
    return functools.partial(metrics.string_label_to_class_id,
                             label_names=list(benchmark.label_names))


# ----------------------------------------------------------------------------- readers


def _check(path: str) -> str:
    if not os.path.exists(path):
        raise UserError(f"{path} does not exist; pass the directory that holds the official "
                        "files (see t5lite/tasks/formats.py for the layout).")
    return path


def read_glue_tsv(path: str, benchmark: Benchmark) -> list[dict]:
    """An official GLUE TSV (train.tsv / dev.tsv) -> TFDS-style dicts."""
    cols = benchmark.columns
    with open(_check(path), encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if isinstance(cols["label"], str):  # has a header row
        header, rows = rows[0], rows[1:]
        index = {k: header.index(v) for k, v in cols.items()}
    else:
        index = dict(cols)
    out = []
    for i, row in enumerate(rows):
        if len(row) <= max(index.values()):
            continue  # the official QQP train file has a few truncated rows
        ex = {k: row[j] for k, j in index.items()}
        label = ex["label"]
        if benchmark.label_names is None:
            ex["label"] = float(label)
        elif benchmark.file_labels:
            ex["label"] = benchmark.file_labels.index(label)
        else:
            ex["label"] = int(label)
        ex["idx"] = i
        out.append(ex)
    return out


def read_superglue_jsonl(path: str, benchmark: Benchmark) -> list[dict]:
    """An official SuperGLUE jsonl file -> TFDS-style dicts (superglue.official_records)."""
    out = []
    with open(_check(path), encoding="utf-8") as f:
        for i, line in enumerate(f):
            for rec in superglue.official_records(json.loads(line)):
                ex = {k: str(rec[k]) for k in benchmark.features}
                label = rec["label"]
                ex["label"] = (benchmark.file_labels.index(label) if benchmark.file_labels
                               else int(label))
                idx = rec.get("idx", i)
                ex["idx"] = idx if isinstance(idx, dict) else int(idx)
                out.append(ex)
    return out


def read_squad_json(path: str) -> list[dict]:
    """SQuAD v1.1 JSON -> {"id", "question", "context", "answers"} per question."""
    with open(_check(path), encoding="utf-8") as f:
        data = json.load(f)["data"]
    return [{"id": qa["id"], "question": qa["question"], "context": para["context"],
             "answers": [a["text"] for a in qa["answers"]]}
            for article in data for para in article["paragraphs"] for qa in para["qas"]]


def read_cnn_story(path: str) -> dict:
    """A CNN/DailyMail .story file: article lines, then '@highlight' + one highlight each."""
    with open(path, encoding="utf-8") as f:
        lines = [l.strip() for l in f]
    article, highlights, in_highlight = [], [], False
    for line in lines:
        if not line:
            continue
        if line == "@highlight":
            in_highlight = True
        elif in_highlight:
            highlights.append(line)
            in_highlight = False
        else:
            article.append(line)
    return {"article": " ".join(article), "highlights": " ".join(
        h if h.endswith(".") else h + " ." for h in highlights)}


def _records_source(split_to_reader: Mapping[str, Callable[[], list[dict]]]):
    """A seqio.FunctionDataSource over records read (in Python) when the dataset is built."""
    def dataset_fn(split, shuffle_files, seed=None):
        del shuffle_files, seed
        records = split_to_reader[split]()
        if not records:
            raise UserError(f"no examples in the {split} split.")
        columns = {k: [r[k] for r in records] for k in records[0]}
        for k, v in columns.items():  # a dict per record (MultiRC's idx) -> a dict of columns
            if isinstance(v[0], dict):
                columns[k] = {kk: [x[kk] for x in v] for kk in v[0]}
        if "answers" in columns:  # variable number of answers: ragged -> keep as ragged
            columns["answers"] = tf.ragged.constant(columns["answers"])
        return tf.data.Dataset.from_tensor_slices(columns)
    return seqio.FunctionDataSource(dataset_fn, splits=list(split_to_reader))


# ----------------------------------------------------------------------------- registration


def _text_task(name, source, preprocessors, vocabulary, metric_fns, postprocess_fn=None):
    vocab = registry._vocabulary(vocabulary)  # pylint: disable=protected-access
    registry.TaskRegistry.remove(name)
    return registry.TaskRegistry.add(
        name, source=source,
        preprocessors=list(preprocessors) + [seqio.preprocessors.tokenize,
                                             seqio.CacheDatasetPlaceholder(),
                                             seqio.preprocessors.append_eos_after_trim],
        output_features=registry.text_features(vocab), metric_fns=list(metric_fns),
        postprocess_fn=postprocess_fn)


def register_glue(data_dir: str, tasks: Sequence[str] = tuple(GLUE), prefix: str = "glue_",
                  vocabulary: Union[str, seqio.Vocabulary] = "t5") -> list[str]:
    """glue_<task> from the official GLUE directory (data_dir/CoLA/train.tsv, .../MNLI/...)."""
    dirs = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B",
            "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
    names = []
    for t in tasks:
        b = GLUE[t]
        files = MNLI_FILES if t == "mnli" else GLUE_FILES
        readers = {s: functools.partial(read_glue_tsv, os.path.join(data_dir, dirs[t], f), b)
                   for s, f in files.items()}
        _text_task(prefix + t, _records_source(readers),
                   [functools.partial(text_to_text, benchmark=b)], vocabulary, b.metric_fns,
                   postprocessor(b))
        names.append(prefix + t)
    return names


def register_superglue(data_dir: str, tasks: Sequence[str] = tuple(SUPERGLUE),
                       prefix: str = "super_glue_",
                       vocabulary: Union[str, seqio.Vocabulary] = "t5") -> list[str]:
    """super_glue_<task> from the official SuperGLUE jsonl (data_dir/BoolQ/train.jsonl ...)."""
    dirs = {"boolq": "BoolQ", "cb": "CB", "copa": "COPA", "rte": "RTE", "multirc": "MultiRC",
            "wic": "WiC", "wsc": "WSC"}
    names = []
    for t in tasks:
        b = SUPERGLUE[t]
        readers = {s: functools.partial(read_superglue_jsonl,
                                        os.path.join(data_dir, dirs[t], f), b)
                   for s, f in SUPERGLUE_FILES.items()}
        _text_task(prefix + t, _records_source(readers),
                   [functools.partial(text_to_text, benchmark=b)], vocabulary, b.metric_fns,
                   postprocessor(b))
        names.append(prefix + t)
    return names


def squad_text(dataset):
    """SQuAD -> "question: Q context: C" -> first answer (``answers`` kept for the metric)."""
    def fmt(x):
        return {"inputs": tf.strings.join(["question:", x["question"], "context:",
                                           x["context"]], " "),
                "targets": x["answers"][0], "answers": x["answers"]}
    return dataset.map(fmt, num_parallel_calls=tf.data.AUTOTUNE)


def register_squad(split_to_json: Mapping[str, str], name: str = "squad_v010",
                   vocabulary: Union[str, seqio.Vocabulary] = "t5") -> str:
    """SQuAD v1.1 from the official JSON files, e.g. {"train": "train-v1.1.json",
    "validation": "dev-v1.1.json"}; metrics: EM and F1 over all answers."""
    readers = {s: functools.partial(read_squad_json, p) for s, p in split_to_json.items()}
    _text_task(name, _records_source(readers), [squad_text], vocabulary, [metrics.squad],
               metrics.qa_answers)
    return name


def summarize_text(dataset, article_key="article", summary_key="highlights"):
    return dataset.map(lambda x: {"inputs": tf.strings.join(["summarize:", x[article_key]], " "),
                                  "targets": x[summary_key]},
                       num_parallel_calls=tf.data.AUTOTUNE)


def register_cnn_dailymail(split_to_glob: Mapping[str, str], name: str = "cnn_dailymail",
                           vocabulary: Union[str, seqio.Vocabulary] = "t5") -> str:
    """CNN/DailyMail from .story files, e.g. {"train": "cnn/stories/*.story"} (use the
    official URL lists to place files in splits); metric: ROUGE."""
    def reader(pattern):
        files = sorted(glob.glob(pattern))
        if not files:
            raise UserError(f"no .story files match {pattern!r}.")
        return [read_cnn_story(f) for f in files]
    readers = {s: functools.partial(reader, g) for s, g in split_to_glob.items()}
    _text_task(name, _records_source(readers), [summarize_text], vocabulary, [metrics.rouge])
    return name


def translate_text(dataset, source_language="English", target_language="German",
                   source_key="en", target_key="de"):
    prefix = f"translate {source_language} to {target_language}:"
    return dataset.map(lambda x: {"inputs": tf.strings.join([prefix, x[source_key]], " "),
                                  "targets": x[target_key]},
                       num_parallel_calls=tf.data.AUTOTUNE)


def register_wmt(split_to_files: Mapping[str, tuple], name: str = "wmt_t2t_ende",
                 source: tuple = ("en", "English"), target: tuple = ("de", "German"),
                 vocabulary: Union[str, seqio.Vocabulary] = "t5") -> str:
    """WMT from line-aligned plain-text files, e.g. {"validation": ("newstest2013.en",
    "newstest2013.de")}; metric: sacrebleu BLEU."""
    def reader(src_path, tgt_path):
        with open(_check(src_path), encoding="utf-8") as fs, \
                open(_check(tgt_path), encoding="utf-8") as ft:
            src, tgt = fs.read().splitlines(), ft.read().splitlines()
        if len(src) != len(tgt):
            raise UserError(f"{src_path} has {len(src)} lines, {tgt_path} {len(tgt)}; "
                            "the files must be line-aligned.")
        return [{source[0]: s, target[0]: t} for s, t in zip(src, tgt)]
    readers = {s: functools.partial(reader, *files) for s, files in split_to_files.items()}
    _text_task(name, _records_source(readers),
               [functools.partial(translate_text, source_language=source[1],
                                  target_language=target[1], source_key=source[0],
                                  target_key=target[0])],
               vocabulary, [metrics.bleu])
    return name


# ----------------------------------------------------------------------------- the paper (TFDS)

# TFDS names and versions of the T5 paper's data (seqio.TfdsDataSource reads them from the TFDS
# data dir: $TFDS_DATA_DIR or ~/tensorflow_datasets; `tfds build` them there first).
TFDS = {
    "c4": "c4/en:3.1.0",  # T5 read 3.0.1, which today's TFDS no longer builds
    # Table 8's other pretraining sets (T5's tasks read the same C4 configs); webtextlike needs
    # OpenWebText's URL list downloaded by hand (TFDS's manual download instructions)
    "c4_noclean": "c4/en.noclean:3.1.0",
    "c4_realnewslike": "c4/realnewslike:3.1.0",
    "c4_webtextlike": "c4/webtextlike:3.1.0",
    # T5 read the 20190301 dump, whose files are gone; TFDS builds only this one today
    "wikipedia": "wikipedia/20230601.en:1.0.0",
    "glue": "glue/{task}:2.0.0",
    "super_glue": "super_glue/{task}:1.0.2",
    "squad": "squad/v1.1:3.0.0",
    "cnn_dailymail": "cnn_dailymail:3.4.0",
    "wmt_ende": "wmt_t2t_translate/de-en:1.0.0",
    "wmt_enfr": "wmt14_translate/fr-en:1.0.0",
    "wmt_enro": "wmt16_translate/ro-en:1.0.0",
    "dpr": "definite_pronoun_resolution:1.1.0",
}
# the tasks evaluated for the paper's GLUE and SuperGLUE scores (task_catalog.PAPER_*_SCORE)
PAPER_GLUE = list(task_catalog.score_tasks(task_catalog.PAPER_GLUE_SCORE))
PAPER_SUPERGLUE = list(task_catalog.score_tasks(task_catalog.PAPER_SUPERGLUE_SCORE))
PAPER_TASKS = (["paper_glue", "paper_super_glue"] + PAPER_GLUE + PAPER_SUPERGLUE
               + ["paper_squad", "paper_cnn_dailymail", "paper_wmt_ende", "paper_wmt_enfr",
                  "paper_wmt_enro"])


# TFDS's MNLI has no plain validation / test split: its matched and mismatched sets (T5's
# glue_mnli splits); paper_glue_mnli_matched / _mismatched evaluate them as validation / test
MNLI_SPLITS = ["train"] + [f"{s}_{k}" for s in ("validation", "test")
                           for k in task_catalog.MNLI_EVAL]


def _squad_tfds(dataset):
    return dataset.map(lambda x: {"question": x["question"], "context": x["context"],
                                  "answers": x["answers"]["text"]})


def _wmt_tfds(src: str, tgt: str, src_name: str, tgt_name: str):
    return functools.partial(translate_text, source_language=src_name,
                             target_language=tgt_name, source_key=src, target_key=tgt)


def _paper_superglue_special(src) -> dict:
    """T5's WSC (evaluation: every example; training: the positive ones), DPR and ReCoRD."""
    wsc, splits = TFDS["super_glue"].format(task="wsc.fixed"), ["train", "validation", "test"]
    return {
        "paper_super_glue_wsc": (src(wsc, splits=["validation", "test"]),
                                 [superglue.wsc_simple_text], metrics.wsc_simple),
        "paper_super_glue_wsc_train": (
            src(wsc, splits=["train"]),
            [functools.partial(superglue.wsc_simple_text, positives_only=True)], None),
        "paper_super_glue_dpr": (src(TFDS["dpr"], splits=["train", "test"]),
                                 [superglue.dpr_simple_text], None),
        "paper_super_glue_record": (src(TFDS["super_glue"].format(task="record"), splits=splits),
                                    [superglue.record_text], metrics.record)}


def _paper_benchmarks() -> dict:
    """paper task name -> (TFDS source, text preprocessors, postprocess_fn)."""
    src = seqio.TfdsDataSource
    out = {}
    for t, b in GLUE.items():
        text = [functools.partial(text_to_text, benchmark=b, prefix=t)]
        splits = MNLI_SPLITS if t == "mnli" else ["train", "validation", "test"]
        out[f"paper_glue_{t}"] = (src(TFDS["glue"].format(task=t), splits=splits), text,
                                  postprocessor(b))
    for s in task_catalog.MNLI_EVAL:  # MNLI's two evaluation sets, each its own task
        out[f"paper_glue_mnli_{s}"] = (
            src(TFDS["glue"].format(task="mnli"),
                splits={"validation": f"validation_{s}", "test": f"test_{s}"}),
            [functools.partial(text_to_text, benchmark=GLUE["mnli"], prefix="mnli")],
            postprocessor(GLUE["mnli"]))
    for t, b in SUPERGLUE.items():
        if t == "wsc":  # the paper's is T5's simple WSC (below)
            continue
        out[f"paper_super_glue_{t}"] = (
            src(TFDS["super_glue"].format(task=t), splits=["train", "validation", "test"]),
            [functools.partial(text_to_text, benchmark=b, prefix=t)], postprocessor(b))
    out.update(_paper_superglue_special(src))
    out["paper_squad"] = (src(TFDS["squad"], splits=["train", "validation"]),
                          [_squad_tfds, squad_text], metrics.qa_answers)
    out["paper_cnn_dailymail"] = (src(TFDS["cnn_dailymail"],
                                      splits=["train", "validation", "test"]),
                                  [summarize_text], None)
    for key, (s, t, sn, tn) in {"wmt_ende": ("en", "de", "English", "German"),
                                "wmt_enfr": ("en", "fr", "English", "French"),
                                "wmt_enro": ("en", "ro", "English", "Romanian")}.items():
        out[f"paper_{key}"] = (src(TFDS[key], splits=["train", "validation", "test"]),
                               [_wmt_tfds(s, t, sn, tn)], None)
    return out


def register_paper_task(name: str, vocabulary: Union[str, seqio.Vocabulary],
                        metric_names: Sequence[str], benchmarks: Optional[dict] = None) -> str:
    """One of the T5 paper's benchmarks (a name in PAPER_TASKS) from TFDS, or of
    ``benchmarks`` (name -> (source, text preprocessors, postprocess_fn))."""
    source, preprocessors, postprocess_fn = (benchmarks or _paper_benchmarks())[name]
    _text_task(name, source, preprocessors, vocabulary, metrics.by_name(metric_names),
               postprocess_fn)
    return name


def register_paper_tasks(vocabulary: Union[str, seqio.Vocabulary] = "t5") -> list[str]:
    """The T5 paper's benchmarks from TFDS with the ``t5`` vocabulary (names in PAPER_TASKS):
    paper_glue_<task> and the mixture paper_glue, paper_super_glue_<task> (all eight, WSC's
    training half and DPR) and paper_super_glue, paper_squad, paper_cnn_dailymail,
    paper_wmt_{ende,enfr,enro}, as task_catalog lists them. Nothing is read until a dataset is
    built."""
    benchmarks = _paper_benchmarks()  # the catalog's other benchmarks: tasks/narang_tasks.py
    for spec in task_catalog.task_specs():
        if spec.recipe == "benchmark" and spec.name in benchmarks:
            register_paper_task(spec.name, vocabulary, spec.metrics, benchmarks)
    for mixture in task_catalog.mixture_specs():
        if mixture.name in ("paper_glue", "paper_super_glue"):
            registry.register_mixture(mixture.name, mixture.members, mixture.rate,
                                      cap=mixture.cap)
    return PAPER_TASKS
