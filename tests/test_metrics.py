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
    assert metrics.f1_binary([0, 0], [0, 0])["f1"] == 0.0
    # T5's f1_score_with_invalid: a prediction that is no label (-1) is the wrong class
    # whatever the target: [1, -1, -1] against [1, 1, 0] reads [1, 0, 1]: tp=1 fp=1 fn=1
    assert metrics.f1_binary([1, 1, 0], [1, -1, -1])["f1"] == pytest.approx(50.0)


def test_cb_mean_f1_over_all_three_classes():
    # class 0: tp=1 fp=1 fn=0 -> 2/3; class 1: tp=1 fp=0 fn=1 -> 2/3; class 2 (never
    # predicted, never true) -> 0, still averaged in (T5's labels=range(3))
    got = metrics.mean_3class_f1([0, 1, 1], [0, 1, 0])["mean_3class_f1"]
    assert got == pytest.approx(100 * (2 / 3 + 2 / 3 + 0) / 3)


def test_matthews():
    t, p = [1, 1, 1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1, 1, 0]
    # tp=3 tn=3 fp=1 fn=1: (9 - 1) / sqrt(4 * 4 * 4 * 4) = 0.5
    assert metrics.matthews_corrcoef(t, p)["matthews_corrcoef"] == pytest.approx(50.0)
    assert metrics.matthews_corrcoef([1, 0], [1, 1])["matthews_corrcoef"] == 0.0


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
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])  # T5: no stemming
    for key in ("rouge1", "rouge2", "rougeL"):
        want = np.mean([scorer.score(r, h)[key].fmeasure for r, h in zip(refs, hyps)])
        assert out[key] == pytest.approx(100 * want)
    assert metrics.rouge(refs, refs)["rougeLsum"] == pytest.approx(100.0)


def test_postprocessors():
    labels = ["negative", "positive"]
    assert metrics.string_label_to_class_id(b"positive", label_names=labels) == 1
    assert metrics.string_label_to_class_id("great", label_names=labels) == -1
    assert metrics.string_to_float(b"3.2") == pytest.approx(3.2)
    assert metrics.string_to_float("n/a") == -1.0  # T5's: far from any score, not NaN
    ex = {"answers": np.array([b"a", b"b"], dtype=object)}
    assert metrics.qa_answers(b"a", example=ex, is_target=True) == ["a", "b"]
    assert metrics.qa_answers(b"x", example=ex, is_target=False) == "x"


def test_multirc_f1_over_answers_and_exact_match_per_question():
    """F1a over every answer option; EM per question (all its options right), averaged over
    questions, not options (T5's mean_group_metric(all_match) by question)."""
    ex = [{"idx/paragraph": 0, "idx/question": q} for q in (0, 0, 0, 1, 1)]
    labels, outputs = ["True", "False", "True", "False", "True"], ["True", "False", "False",
                                                                    "False", "True"]
    targets = [metrics.multirc(lab, example=e, is_target=True) for lab, e in zip(labels, ex)]
    preds = [metrics.multirc(o, example=e) for o, e in zip(outputs, ex)]
    assert targets[0] == {"value": 1, "group": (0, 0)} and preds[2] == {"value": 0}
    # options: tp=2 fn=1 fp=0 -> F1 = 4 / 5; questions: 0 wrong (one option), 1 right
    assert metrics.multirc_f1a(targets, preds) == {"f1a": pytest.approx(80.0)}
    assert metrics.multirc_em(targets, preds) == {"em": pytest.approx(50.0)}
    # the same question index under another paragraph is another question
    other = dict(targets[3], group=(1, 1))
    assert metrics.multirc_em(targets[:3] + [other, targets[4]], preds)["em"] == pytest.approx(
        100 * 2 / 3)


def test_record_scores_each_query_once():
    """ReCoRD's examples repeat a query once per answer; T5's deduplicate_metric scores the
    query once, with SQuAD's max over all its answers."""
    exs = [{"answers": [b"Paris", b"France"], "idx/passage": 0, "idx/query": 0}] * 2 + [
        {"answers": [b"Rome"], "idx/passage": 0, "idx/query": 1}]
    targets = [metrics.record(b"x", example=e, is_target=True) for e in exs]
    assert targets[0] == {"value": ["Paris", "France"], "group": (0, 0)}
    preds = [metrics.record(p) for p in (b"france", b"france", b"Milan")]
    # queries: EM 1 and 0 -> 50 (counting the repeat would give 2 / 3)
    assert metrics.record_squad(targets, preds) == {"em": pytest.approx(50.0),
                                                   "f1": pytest.approx(50.0)}


def test_wsc_simple_names_the_candidate():
    """T5's wsc_simple postprocessor: 1 when the model names the example's candidate noun
    (ignoring case and determiners, either word set inside the other), else 0; an empty
    answer -1; the target is the label."""
    ex = {"targets_pretokenized": b"the fuzzy bunny", "label": 1}
    assert metrics.wsc_simple(b"x", example=ex, is_target=True) == 1
    for answer, want in [(b"The Fuzzy Bunny", 1), (b"bunny", 1), (b"a big fuzzy bunny", 1),
                         (b"the cat", 0), (b"", -1), (b"the", -1)]:
        assert metrics.wsc_simple(answer, example=ex) == want, answer
    bob = {"targets_pretokenized": b"Bob", "label": 0}
    assert metrics.wsc_simple(b"Bob's hat", example=bob) == 0  # never across a possessive
    assert metrics.wsc_simple(b"bob", example=bob) == 1
    # scored by accuracy against the label: naming a wrong candidate (label 0) is wrong
    assert metrics.accuracy([0, 1], [1, 1])["accuracy"] == pytest.approx(50.0)
