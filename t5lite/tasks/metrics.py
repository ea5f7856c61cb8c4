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


# ----------------------------------------------------------------------------- postprocessors


def _text(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def string_label_to_class_id(output, example=None, is_target=False, label_names=(),
                             default=-1):
    """A label name -> its index in label_names (unknown predictions -> default)."""
    del example, is_target
    text = _text(output).strip()
    return label_names.index(text) if text in label_names else default


def string_to_float(output, example=None, is_target=False, default=float("nan")):
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


# ----------------------------------------------------------------------------- classification


def accuracy(targets, predictions) -> dict:
    t, p = np.asarray(targets), np.asarray(predictions)
    return {"accuracy": 100.0 * float(np.mean(t == p)) if len(t) else 0.0}


def _f1(t, p, positive) -> float:
    tp = np.sum((p == positive) & (t == positive))
    fp = np.sum((p == positive) & (t != positive))
    fn = np.sum((p != positive) & (t == positive))
    return 0.0 if tp == 0 else 2.0 * tp / (2.0 * tp + fp + fn)


def f1_binary(targets, predictions, positive=1) -> dict:
    """F1 of the positive class (MRPC, QQP); labels are class ids."""
    return {"f1": 100.0 * _f1(np.asarray(targets), np.asarray(predictions), positive)}


def f1_macro(targets, predictions) -> dict:
    """Unweighted mean of per-class F1 over the classes seen in the targets (CB)."""
    t, p = np.asarray(targets), np.asarray(predictions)
    return {"f1_macro": 100.0 * float(np.mean([_f1(t, p, c) for c in np.unique(t)]))}


def matthews_corrcoef(targets, predictions) -> dict:
    """Matthews correlation (CoLA), multi-class form (Gorodkin 2004); 0 when undefined."""
    t, p = np.asarray(targets), np.asarray(predictions)
    classes = np.unique(np.concatenate([t, p]))
    conf = np.array([[np.sum((t == a) & (p == b)) for b in classes] for a in classes],
                    dtype=np.float64)
    n, correct = conf.sum(), np.trace(conf)
    t_sum, p_sum = conf.sum(axis=1), conf.sum(axis=0)
    cov_tp = correct * n - np.dot(t_sum, p_sum)
    cov_tt = n * n - np.dot(t_sum, t_sum)
    cov_pp = n * n - np.dot(p_sum, p_sum)
    denom = np.sqrt(cov_tt * cov_pp)
    return {"matthews_corrcoef": 100.0 * float(cov_tp / denom) if denom else 0.0}


def pearson_corrcoef(targets, predictions) -> dict:
    return {"pearson_corrcoef": 100.0 * float(scipy.stats.pearsonr(targets, predictions)[0])}


def spearman_corrcoef(targets, predictions) -> dict:
    return {"spearman_corrcoef":
            100.0 * float(scipy.stats.spearmanr(targets, predictions)[0])}


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


def squad(targets: Sequence, predictions: Sequence[str]) -> dict:
    """Exact match and token F1, each the max over an example's reference answers."""
    em, f1 = [], []
    for answers, pred in zip(targets, predictions):
        answers = [answers] if isinstance(answers, str) else list(answers)
        em.append(max(float(normalize_squad(pred) == normalize_squad(a)) for a in answers))
        f1.append(max(_squad_f1(pred, a) for a in answers))
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1))}


# ----------------------------------------------------------------------------- generation


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict:
    """Corpus BLEU as T5 reports it: sacrebleu with the "intl" tokenizer (exp smoothing,
    no lowercasing), not sacrebleu's default 13a."""
    import sacrebleu
    refs = [[t if isinstance(t, str) else t[0] for t in targets]]
    return {"bleu": sacrebleu.corpus_bleu(list(predictions), refs, tokenize="intl").score}


def rouge(targets: Sequence[str], predictions: Sequence[str],
          types=("rouge1", "rouge2", "rougeL", "rougeLsum")) -> dict:
    """Mean ROUGE F-measure x100 (rouge-score, Porter stemming; rougeLsum over lines)."""
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(list(types), use_stemmer=True)
    # rougeLsum treats newlines as sentence boundaries.
    scores = [scorer.score(target=t.replace(". ", ".\n"), prediction=p.replace(". ", ".\n"))
              for t, p in zip(targets, predictions)]
    return {k: 100.0 * float(np.mean([s[k].fmeasure for s in scores])) for k in types}


def sequence_accuracy(targets, predictions) -> dict:
    """Exact string match (after stripping), for free-form short answers."""
    return {"sequence_accuracy": 100.0 * float(np.mean(
        [_text(t).strip() == _text(p).strip() for t, p in zip(targets, predictions)]))}


def by_name(names: Sequence[str]) -> list:
    """The metric functions of this module named ``names`` (as task_catalog lists them)."""
    return [globals()[name] for name in names]
