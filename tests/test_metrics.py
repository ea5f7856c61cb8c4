"""Metrics against hand-computed values and the reference libraries."""

import numpy as np
import pytest
import sacrebleu
import scipy.stats
from rouge_score import rouge_scorer

from t5lite.tasks import metrics


def test_accuracy_and_f1():
    t, p = [1, 0, 1, 1, 0, 1], [1, 0, 0, 1, 1, 1]
    assert metrics.accuracy(t, p)["accuracy"] == pytest.approx(100 * 4 / 6)
    # tp=3, fp=1, fn=1 -> F1 = 6 / 8
    assert metrics.f1_binary(t, p)["f1"] == pytest.approx(75.0)
    # Class 0: tp=1, fp=1, fn=1 -> 0.5; class 1: 0.75.
    assert metrics.f1_macro(t, p)["f1_macro"] == pytest.approx(62.5)
    assert metrics.f1_binary([0, 0], [0, 0])["f1"] == 0.0


def test_matthews():
    t, p = [1, 1, 1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1, 1, 0]
    # tp=3 tn=3 fp=1 fn=1: (9 - 1) / sqrt(4 * 4 * 4 * 4) = 0.5
    assert metrics.matthews_corrcoef(t, p)["matthews_corrcoef"] == pytest.approx(50.0)
    assert metrics.matthews_corrcoef([1, 0], [1, 1])["matthews_corrcoef"] == 0.0
    rng = np.random.RandomState(0)
    t3, p3 = rng.randint(0, 3, 200), rng.randint(0, 3, 200)
    p3[:120] = t3[:120]
    # Multi-class MCC equals the binary formula's generalisation: check symmetry and range.
    m = metrics.matthews_corrcoef(t3, p3)["matthews_corrcoef"]
    assert m == pytest.approx(metrics.matthews_corrcoef(p3, t3)["matthews_corrcoef"])
    assert 0 < m < 100


def test_correlations_match_scipy():
    rng = np.random.RandomState(0)
    t = rng.uniform(0, 5, 50)
    p = t + rng.normal(0, 1, 50)
    assert metrics.pearson_corrcoef(t, p)["pearson_corrcoef"] == pytest.approx(
        100 * scipy.stats.pearsonr(t, p)[0])
    assert metrics.spearman_corrcoef(t, p)["spearman_corrcoef"] == pytest.approx(
        100 * scipy.stats.spearmanr(t, p)[0])


def test_squad_official_normalisation():
    assert metrics.normalize_squad("The  Cat, sat!") == "cat sat"
    out = metrics.squad([["the cat", "a dog"], ["Denver Broncos"], ["42"]],
                        ["Cat", "Broncos of Denver", "forty two"])
    # EM: 1, 0, 0. F1: 1, 2*(2/3*1)/(2/3+1)=0.8, 0.
    assert out["em"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * (1 + 0.8) / 3)


def test_bleu_matches_sacrebleu():
    refs = ["the cat sat on the mat", "a quick brown fox jumps"]
    hyps = ["the cat sat on a mat", "a quick brown fox jumped"]
    assert metrics.bleu(refs, hyps)["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [refs], tokenize="intl").score)  # T5's BLEU
    assert metrics.bleu(refs, refs)["bleu"] == pytest.approx(100.0)


def test_rouge_matches_rouge_score():
    refs = ["the cat sat on the mat", "police killed the gunman"]
    hyps = ["the cat was on the mat", "the gunman was killed by police"]
    out = metrics.rouge(refs, hyps)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    for key in ("rouge1", "rouge2", "rougeL"):
        want = np.mean([scorer.score(r, h)[key].fmeasure for r, h in zip(refs, hyps)])
        assert out[key] == pytest.approx(100 * want)
    assert metrics.rouge(refs, refs)["rougeLsum"] == pytest.approx(100.0)


def test_postprocessors():
    labels = ["negative", "positive"]
    assert metrics.string_label_to_class_id(b"positive", label_names=labels) == 1
    assert metrics.string_label_to_class_id("great", label_names=labels) == -1
    assert metrics.string_to_float(b"3.2") == pytest.approx(3.2)
    assert np.isnan(metrics.string_to_float("n/a"))
    ex = {"answers": np.array([b"a", b"b"], dtype=object)}
    assert metrics.qa_answers(b"a", example=ex, is_target=True) == ["a", "b"]
    assert metrics.qa_answers(b"x", example=ex, is_target=False) == "x"
