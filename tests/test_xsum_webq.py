"""Narang et al. 2021's XSum and closed-book WebQuestions (tasks/narang_tasks.py): the tasks
read strict TFDS fixtures (tests/tfds_fixtures.py) into T5's text-to-text examples, score as
T5 does (ROUGE without stemming, SQuAD-normalised exact match over every answer), and the
modifications table plans, estimates and renders them at --scale paper."""

import pytest
import seqio
from rouge_score import rouge_scorer

import tfds_fixtures
from t5lite import ablations, task_catalog
from t5lite.ablations import modifications
from t5lite.ablations.files import write_json
from t5lite.ablations.plan import default_tasks, plan_row
from t5lite.tasks import metrics

LENGTHS = {"inputs": 64, "targets": 16}
TABLE = modifications.TABLE
NAMES = ("xsum:1.1.0", "web_questions:1.0.0")


@pytest.fixture(scope="module")
def narang_tfds(data_dir, tmp_path_factory):
    """XSum and WebQuestions as strict TFDS fixtures, their tasks registered over them with
    the test vocabulary (the t5 one restored afterwards)."""
    from t5lite.tasks import builtin
    specs = [s for s in task_catalog.task_specs() if s.name in task_catalog.NARANG_METRICS]
    root = tfds_fixtures.write_all(str(tmp_path_factory.mktemp("tfds")), NAMES)
    seqio.set_tfds_data_dir_override(root)
    for spec in specs:
        builtin.register_task(spec, "t5lite_sp8k")
    yield root
    seqio.set_tfds_data_dir_override(None)
    for spec in specs:
        builtin.register_task(spec)


def _examples(name: str, split: str) -> list[dict]:
    ds = seqio.get_mixture_or_task(name).get_dataset(LENGTHS, split=split, shuffle=False)
    return list(ds.as_numpy_iterator())


def test_the_builders_splits_and_versions():
    """WebQuestions' builder generates train and test only (its own _split_generators, run
    offline); XSum's reads its split file, so its names are pinned from its code."""
    import tensorflow_datasets as tfds
    assert tfds_fixtures.builder_splits("web_questions:1.0.0") == ("train", "test")
    assert tfds_fixtures.builder_splits("xsum:1.1.0") == ("train", "validation", "test")
    assert str(tfds.builder_cls("xsum").VERSION) == "1.1.0"
    assert str(tfds.builder_cls("web_questions").VERSION) == "1.0.0"


def _text(examples) -> list[tuple]:
    return sorted((e["inputs_pretokenized"].decode(), e["targets_pretokenized"].decode())
                  for e in examples)


def test_xsum_is_t5s_summarize(narang_tfds):
    want = sorted((f"summarize: {x['document']}", x["summary"])
                  for x in tfds_fixtures.EXAMPLES["xsum"])
    assert want[1] == ("summarize: The council said the bridge would close for repairs on "
                       "Monday. Drivers were told to use the ring road.",
                       "A town bridge is to close for repairs.")
    for split in ("train", "validation", "test"):
        assert _text(_examples("paper_xsum", split)) == want


def test_web_questions_is_closed_book_and_validates_past_the_cut(narang_tfds):
    """Training reads the train split's first 3,417 questions (TFDS's stored order), validation
    the rest and nothing else; each the question alone ("wq question: ..."), its first answer
    the target and every answer kept for the metric."""
    fixture = {x["question"]: x["answers"]
               for x in tfds_fixtures.EXAMPLES["web_questions"]["train"]}
    held_out = _examples("paper_web_questions", "validation")
    assert len(held_out) == 2
    for e in held_out:
        question = e["inputs_pretokenized"].decode().removeprefix("wq question: ")
        assert [a.decode() for a in e["answers"]] == fixture[question]
        assert e["targets_pretokenized"].decode() == fixture[question][0]
    train = seqio.get_mixture_or_task("paper_web_questions").source.get_dataset(
        "train", shuffle=False)
    trained = {x["question"].decode() for x in train.as_numpy_iterator()}
    assert len(trained) == 3417 and trained | {
        e["inputs_pretokenized"].decode()[len("wq question: "):] for e in held_out} == set(
        fixture)
    (test,) = _examples("paper_web_questions", "test")
    assert (test["inputs_pretokenized"], test["targets_pretokenized"]) == (
        b"wq question: where is rome?", b"Italy")
    assert [a.decode() for a in test["answers"]] == ["Italy", "Lazio"]


def test_web_questions_scores_exact_match_against_any_answer(narang_tfds):
    """The registered task's postprocessor gives every answer as the target (as seqio's
    Evaluator calls it) and its metric is SQuAD's EM / F1 after SQuAD's normalisation."""
    task = seqio.get_mixture_or_task("paper_web_questions")
    (test,) = _examples("paper_web_questions", "test")
    targets = [task.postprocess_fn(test["targets_pretokenized"], example=test, is_target=True)]
    assert targets == [["Italy", "Lazio"]]
    (metric,) = task.metric_fns
    # case, punctuation and articles do not count; any answer is right
    assert metric(targets, [task.postprocess_fn(b"The Lazio.")]) == {"em": 100.0, "f1": 100.0}
    answers = [["France"], ["Emma", "Persuasion", "Pride and Prejudice"]]
    # "&" is not "and": no exact match, F1 2 * (1 * 2/3) / (1 + 2/3) = 0.8
    assert metric(answers, ["france", "Pride & Prejudice"]) == pytest.approx(
        {"em": 50.0, "f1": 90.0})


def test_xsum_rouge_is_t5s():
    """ROUGE-2 F x100 as T5 computes it: rouge-score without stemming ("cats" is not "cat"),
    rougeLsum over the sentences T5 splits at " . "; the mean over examples."""
    refs = ["the cat sat on the mat", "the cats are running"]
    preds = ["the cat was on the mat", "the cat is running"]
    out = metrics.rouge(refs, preds)
    assert out["rouge2"] == pytest.approx(100 * (3 / 5 + 0) / 2)  # shared bigrams / 5; none
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"])
    for key in ("rouge1", "rouge2"):
        assert out[key] == pytest.approx(50 * sum(
            scorer.score(r, p)[key].fmeasure for r, p in zip(refs, preds)))
    swapped = metrics.rouge(["a b . c d"], ["c d . a b"])
    assert swapped["rougeLsum"] == pytest.approx(100.0) and swapped["rougeL"] < 100.0
    task_metrics = seqio.get_mixture_or_task("paper_xsum").metric_fns
    assert task_metrics == [metrics.rouge]


def test_paper_scale_finetunes_on_xsum_and_web_questions():
    """--scale paper: XSum for 2^18 steps of 2,048 / 178 tokens x 32 and WebQuestions for
    30,000, each continuing the pretraining run at 5e-4 with dropout 0.1; a Synthesizer row
    (weights sized by the length) finetunes XSum on 512 inputs x 128, the same tokens."""
    assert default_tasks(TABLE, "paper") == ("super_glue", "xsum", "web_questions",
                                             "wmt_ende_scratch")
    pre, fts = plan_row(TABLE, TABLE.row("vanilla"), "/w", default_tasks(TABLE, "paper"),
                        "paper")
    xsum, webq = {ft.task: ft for ft in fts}["xsum"], {ft.task: ft for ft in fts}[
        "web_questions"]
    for ft, mixture, steps in ((xsum, "paper_xsum", 2 ** 18),
                               (webq, "paper_web_questions", 30000)):
        assert ft.cfg.data.mixture_or_task == mixture
        assert ft.start == pre.cfg.train.steps == 2 ** 19
        assert ft.cfg.train.steps == 2 ** 19 + steps and ft.cfg.checkpoint.init_state
        assert (ft.cfg.optim.learning_rate, ft.cfg.optim.schedule) == (5e-4, "constant")
        assert ft.cfg.model.dropout_rate == 0.1
    assert dict(xsum.cfg.data.feature_lengths) == {"inputs": 2048, "targets": 178}
    assert xsum.cfg.data.batch_size == 32 and xsum.cfg.decode.max_length == 178
    _, synth = plan_row(TABLE, TABLE.row("synthesizer_random"), "/w", ("super_glue", "xsum"),
                        "paper")
    assert [(dict(ft.cfg.data.feature_lengths), ft.cfg.data.batch_size) for ft in synth] == [
        ({"inputs": 512, "targets": 512}, 128), ({"inputs": 512, "targets": 178}, 128)]


def test_estimate_and_dry_run_list_the_stages(data_dir, capsys):
    out = ablations.estimate(TABLE, rows=["vanilla"], scale="paper")
    assert out["rows"]["vanilla"]["steps"] == 2 ** 19 + 2 * 2 ** 18 + 30000 + 150000
    ablations.run(TABLE, "/w", rows=["vanilla"], scale="paper", dry_run=True)
    printed = capsys.readouterr().out
    for task in ("paper_xsum", "paper_web_questions"):
        assert f"--set data.mixture_or_task={task}" in printed
        assert f"--task {task} --split validation" in printed


def test_render_fills_the_xsum_and_webq_columns(tmp_path):
    metrics_ = {"super_glue/average": 70.0, "paper_xsum/rouge2": 17.5,
                "paper_web_questions/em": 24.0, "paper_wmt_ende/bleu": 26.0}
    for name, shift in (("vanilla", 0.0), ("gelu", 1.0)):
        write_json(str(tmp_path / "modifications" / name / "result.json"), {
            "metrics": {k: v + shift for k, v in metrics_.items()}, "runs": {"0": {}},
            "scale": "paper", "split": "validation"})
    text = ablations.render(TABLE, str(tmp_path))
    header = text.splitlines()[2]
    order = ["super_glue average", "paper_xsum rouge2", "paper_web_questions em",
             "paper_wmt_ende bleu"]
    assert [header.index(h) for h in order] == sorted(header.index(h) for h in order)
    gelu = next(line for line in text.splitlines() if line.startswith("| GeLU"))
    assert "| **18.50** | **25.00** |" in gelu
    assert "last 361 of its 3,778 training questions" in text
