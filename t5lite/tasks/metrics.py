"""Metrics (seqio metric_fn signature: (targets, predictions) -> {name: value}) and
postprocessors (seqio signature: (output, example=None, is_target=False) -> value).

Values are percentages (0-100) where the T5 paper reports them so, except correlations,
which are x100 as well (the paper's GLUE tables).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Sequence

import numpy as np
import scipy.stats
import sklearn.metrics


# ----------------------------------------------------------------------------- postprocessors


def _text(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def string_label_to_class_id(output, example=None, is_target=False, label_names=(),
                             default=-1):
    """A label name -> its index in label_names (unknown predictions -> default)."""
    del example, is_target
    text = _text(output).strip()
    return label_names.index(text) if text in label_names else default


def string_to_float(output, example=None, is_target=False, default=-1.0):
    """STS-B: the decoded score; text that is no number scores ``default`` (T5's -1, far from
    every real score, so a malformed answer costs correlation instead of voiding it)."""
    del example, is_target
    try:
        return float(_text(output).strip())
    except ValueError:
        return default


def qa_answers(output, example=None, is_target=False):
    """SQuAD: targets are all reference answers (from the example's ``answers``)."""
    if is_target and example is not None and "answers" in example:
        return [_text(a) for a in example["answers"]]
    return _text(output)


def multirc(output, example=None, is_target=False):
    """MultiRC: {"value": class id} (False 0 / True 1, else -1); a target also carries its
    question ("group": paragraph and question index) for the per-question exact match."""
    out = {"value": string_label_to_class_id(output, label_names=("False", "True"))}
    if is_target:
        out["group"] = (int(example["idx/paragraph"]), int(example["idx/question"]))
    return out


def record(output, example=None, is_target=False):
    """ReCoRD: {"value": the predicted entity}; a target: {"value": every answer, "group":
    its passage and query}, so that the metric scores each query once (its examples repeat
    the query once per answer)."""
    if is_target:
        return {"value": [_text(a) for a in example["answers"]],
                "group": (int(example["idx/passage"]), int(example["idx/query"]))}
    return {"value": _text(output)}


# Words that do not change which noun a WSC answer names ("the cat" is "cat").
_DETERMINERS = frozenset((
    "a", "an", "few", "her", "his", "each", "every", "many", "much", "my", "our", "some",
    "that", "the", "their", "these", "this", "those", "which", "whose", "your"))


def _referent_words(text) -> str:
    return " ".join(w for w in _text(text).strip().lower().split(" ") if w not in _DETERMINERS)


def wsc_simple(output, example=None, is_target=False):
    """WSC as T5 scores it: the model names a noun; 1 if that is the example's candidate
    referent (targets_pretokenized), else 0, compared with the example's label (1: the
    candidate is the pronoun's referent). Case and determiners are ignored, and either
    answer may be a subset of the other's words ("fuzzy bunny" names "bunny"), but never
    across a possessive ("Bob" is not "Bob's hat"). An empty answer is -1 (never a label).
    Without an example (self-consistency's vote) the normalised answer itself."""
    if is_target:
        return int(example["label"])
    prediction = _referent_words(output)
    if example is None:
        return prediction
    if not prediction:
        return -1
    referent = _referent_words(example["targets_pretokenized"])
    if ("'" in prediction) != ("'" in referent):
        return 0
    p, r = set(prediction.split(" ")), set(referent.split(" "))
    return int(p <= r or r <= p)


def gives(*keys):
    """Marks a metric function with the names of the values it returns, so they are known
    before anything is evaluated (eval.best_metric is TASK/one of them)."""
    def mark(fn):
        fn.metric_keys = keys
        return fn
    return mark


# ----------------------------------------------------------------------------- classification


@gives('accuracy')
def accuracy(targets, predictions) -> dict:
    return {"accuracy": 100.0 * sklearn.metrics.accuracy_score(targets, predictions)
            if len(targets) else 0.0}


def _invalid_as_wrong(targets, predictions) -> tuple:
    """Binary labels: a prediction that is neither class (-1: no label name decoded) counts
    as the wrong class, whatever the target (T5's f1_score_with_invalid)."""
    t, p = np.asarray(targets), np.array(predictions)
    invalid = (p != 0) & (p != 1)
    p[invalid] = 1 - t[invalid]
    return t, p


@gives('f1')
def f1_binary(targets, predictions) -> dict:
    """F1 of the positive class (MRPC, QQP), an invalid prediction counting as wrong."""
    t, p = _invalid_as_wrong(targets, predictions)
    return {"f1": 100.0 * sklearn.metrics.f1_score(t, p, zero_division=0.0)}


@gives('mean_3class_f1')
def mean_3class_f1(targets, predictions) -> dict:
    """CB: the unweighted mean of the F1 of each of the three classes, absent ones too."""
    return {"mean_3class_f1": 100.0 * sklearn.metrics.f1_score(
        targets, predictions, labels=[0, 1, 2], average="macro", zero_division=0.0)}


@gives('matthews_corrcoef')
def matthews_corrcoef(targets, predictions) -> dict:
    """Matthews correlation (CoLA); 0 when undefined (one class only)."""
    return {"matthews_corrcoef": 100.0 * sklearn.metrics.matthews_corrcoef(targets, predictions)}


@gives('pearson_corrcoef')
def pearson_corrcoef(targets, predictions) -> dict:
    return {"pearson_corrcoef": 100.0 * float(scipy.stats.pearsonr(targets, predictions)[0])}


@gives('spearman_corrcoef')
def spearman_corrcoef(targets, predictions) -> dict:
    return {"spearman_corrcoef":
            100.0 * float(scipy.stats.spearmanr(targets, predictions)[0])}


@gives('f1a')
def multirc_f1a(targets, predictions) -> dict:
    """MultiRC F1a: F1 over all answer options (each (question, answer) example)."""
    return {"f1a": f1_binary([t["value"] for t in targets],
                             [p["value"] for p in predictions])["f1"]}


@gives('em')
def multirc_em(targets, predictions) -> dict:
    """MultiRC EM: per question, 1 if every one of its answer options is labelled right;
    averaged over questions (T5's mean_group_metric(all_match))."""
    right = collections.defaultdict(list)
    for t, p in zip(targets, predictions):
        right[t["group"]].append(t["value"] == p["value"])
    return {"em": 100.0 * float(np.mean([all(r) for r in right.values()])) if right else 0.0}


# ----------------------------------------------------------------------------- SQuAD


def normalize_squad(s: str) -> str:
    """The official SQuAD v1.1 normalisation: lower, no punctuation, no articles, one space."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _squad_f1(prediction: str, truth: str) -> float:
    p, t = normalize_squad(prediction).split(), normalize_squad(truth).split()
    common = collections.Counter(p) & collections.Counter(t)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(t)
    return 2 * precision * recall / (precision + recall)


@gives('em', 'f1')
def squad(targets: Sequence, predictions: Sequence[str]) -> dict:
    """Exact match and token F1, each the max over an example's reference answers."""
    em, f1 = [], []
    for answers, pred in zip(targets, predictions):
        answers = [answers] if isinstance(answers, str) else list(answers)
        em.append(max(float(normalize_squad(pred) == normalize_squad(a)) for a in answers))
        f1.append(max(_squad_f1(pred, a) for a in answers))
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1))}


@gives('em', 'f1')
def record_squad(targets, predictions) -> dict:
    """ReCoRD: SQuAD's EM and F1 (max over a query's answers), each query counted once: the
    first of its examples (one per answer) stands for it, as T5's deduplicate_metric."""
    seen, answers, preds = set(), [], []
    for t, p in zip(targets, predictions):
        if t["group"] not in seen:
            seen.add(t["group"])
            answers.append(t["value"])
            preds.append(p["value"])
    return squad(answers, preds)


# ----------------------------------------------------------------------------- generation


@gives('bleu')
def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict:
    """Corpus BLEU as T5 reports it: sacrebleu with the "intl" tokenizer (exp smoothing,
    no lowercasing), not sacrebleu's default 13a."""
    import sacrebleu
    refs = [[t if isinstance(t, str) else t[0] for t in targets]]
    return {"bleu": sacrebleu.corpus_bleu(list(predictions), refs, tokenize="intl").score}


def _summary_lines(text) -> str:
    """T5's sentence split for rougeLsum (which scores each line as a sentence): after each
    space-separated " . ", the end of a sentence in the tokenized summaries (CNN/DM's)."""
    return _text(text).replace(" . ", " .\n")


@gives('rouge1', 'rouge2', 'rougeL', 'rougeLsum')
def rouge(targets: Sequence[str], predictions: Sequence[str],
          types=("rouge1", "rouge2", "rougeL", "rougeLsum")) -> dict:
    """Mean ROUGE F-measure x100 as T5 scores summaries (t5.evaluation.metrics.rouge):
    rouge-score's own tokenizer without stemming, sentences split as _summary_lines. T5
    reports the median of a bootstrap resampling of this mean, which is unseeded and moves by
    hundredths from run to run; this is the mean itself."""
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(list(types))
    scores = [scorer.score(target=_summary_lines(t), prediction=_summary_lines(p))
              for t, p in zip(targets, predictions)]
    return {k: 100.0 * float(np.mean([s[k].fmeasure for s in scores])) for k in types}


@gives('sequence_accuracy')
def sequence_accuracy(targets, predictions) -> dict:
    """Exact string match (after stripping), for free-form short answers."""
    return {"sequence_accuracy": 100.0 * float(np.mean(
        [_text(t).strip() == _text(p).strip() for t, p in zip(targets, predictions)]))}


def by_name(names: Sequence[str]) -> list:
    """The metric functions of this module named ``names`` (as task_catalog lists them)."""
    return [globals()[name] for name in names]


def metric_functions() -> dict:
    """{name: function} of every metric function here (the ones a task's metric_fns take)."""
    return {name: fn for name, fn in globals().items()
            if callable(fn) and hasattr(fn, "metric_keys")}


def describe() -> str:
    """The metric functions, for messages, each with the values it gives where they are
    named otherwise: "accuracy, f1_binary (f1), ..."."""
    return ", ".join(name if fn.metric_keys == (name,) else
                     f"{name} ({', '.join(fn.metric_keys)})"
                     for name, fn in metric_functions().items())
