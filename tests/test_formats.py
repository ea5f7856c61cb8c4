"""T5 text-to-text formats, read from small files in the official formats written here."""

import json
import os

import pytest
import seqio

import tasks_testdata
from t5lite.tasks import formats, metrics

LENGTHS = {"inputs": 256, "targets": 32}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    root = tasks_testdata.make_data_dir(str(tmp_path_factory.mktemp("t5lite_data")))
    return seqio.SentencePieceVocabulary(os.path.join(root, "vocab", "t5lite_sp8k.model"),
                                         extra_ids=100)


def _write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _first(name, split="validation", n=1):
    ds = seqio.get_mixture_or_task(name).get_dataset(LENGTHS, split=split, shuffle=False)
    exs = list(ds.take(n).as_numpy_iterator())
    return [(e["inputs_pretokenized"].decode(), e["targets_pretokenized"].decode(), e)
            for e in exs]


GLUE_FILES = {
    "CoLA": (None, ["gj04\t1\t\tOur friends won't buy this analysis.",
                    "gj04\t0\t*\tThey drank the pub."]),
    "SST-2": ("sentence\tlabel", ["it 's a charming journey . \t1", "dull and slow \t0"]),
    "MRPC": ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
             ["1\t702876\t702977\tHe said hi.\tHe greeted us.", "0\t1\t2\tA cat.\tA dog."]),
    "QQP": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            ["7\t15\t16\tHow do I read?\tHow can I read?\t1", "8\t1\t2\tWhy?\tWho?\t0"]),
    "STS-B": ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
              "sentence2\tscore",
              ["0\tmain\tx\t2012\t1\tnone\tnone\tA plane takes off.\tAn air plane is taking "
               "off.\t3.14", "1\tmain\tx\t2012\t4\tnone\tnone\tA man.\tA woman.\t0.5"]),
    "MNLI": ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
             "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label",
             ["0\t1\t1e\tgov\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tyeah well losing is.\t"
              "The Cardinals won.\tneutral\tneutral",
              "1\t2\t2e\tgov\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tP2.\tH2.\tentailment\t"
              "entailment"]),
    "QNLI": ("index\tquestion\tsentence\tlabel",
             ["0\tWhat is it?\tIt is a test.\tentailment", "1\tWho?\tNo one.\tnot_entailment"]),
    "RTE": ("index\tsentence1\tsentence2\tlabel",
            ["0\tDana Reeve died.\tChristopher Reeve had an accident.\tnot_entailment"]),
    "WNLI": ("index\tsentence1\tsentence2\tlabel",
             ["0\tI stuck a pin through a carrot.\tThe carrot has a hole.\t1"]),
}


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("glue"))
    for d, (header, rows) in GLUE_FILES.items():
        names = (["train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"] if d == "MNLI"
                 else ["train.tsv", "dev.tsv"])
        for name in names:
            _write(os.path.join(root, d, name), ([header] if header else []) + rows)
    return root


@pytest.mark.parametrize("task,inputs,targets", [
    ("cola", "cola sentence: Our friends won't buy this analysis.", "acceptable"),
    ("sst2", "sst2 sentence: it 's a charming journey . ", "positive"),
    ("mrpc", "mrpc sentence1: He said hi. sentence2: He greeted us.", "equivalent"),
    ("qqp", "qqp question1: How do I read? question2: How can I read?", "duplicate"),
    ("stsb", "stsb sentence1: A plane takes off. sentence2: An air plane is taking off.", "3.2"),
    ("mnli", "mnli hypothesis: The Cardinals won. premise: yeah well losing is.", "neutral"),
    ("qnli", "qnli question: What is it? sentence: It is a test.", "entailment"),
    ("rte", "rte sentence1: Dana Reeve died. sentence2: Christopher Reeve had an accident.",
     "not_entailment"),
    ("wnli", "wnli sentence1: I stuck a pin through a carrot. sentence2: The carrot has a "
     "hole.", "entailment"),
])
def test_glue_from_official_tsv(vocab, glue_dir, task, inputs, targets):
    formats.register_glue(glue_dir, tasks=[task], vocabulary=vocab)
    split = "validation_matched" if task == "mnli" else "validation"
    got_inputs, got_targets, ex = _first("glue_" + task, split)[0]
    assert (got_inputs, got_targets) == (inputs, targets)
    assert ex["targets"][-1] == 1  # EOS
    t = seqio.get_mixture_or_task("glue_" + task)
    # Targets and predictions go through the postprocessor, then the metrics.
    label = t.postprocess_fn(targets.encode(), is_target=True)
    if task == "stsb":
        assert label == pytest.approx(3.2)
        assert t.metric_fns[0]([1.0, 2.0, 3.2], [1.2, 2.0, 3.0])["pearson_corrcoef"] > 90
    else:
        assert label == formats.GLUE[task].label_names.index(targets)
        assert t.postprocess_fn(b"garbage") == -1  # an unknown prediction is never right
        results = {}
        for fn in t.metric_fns:
            results.update(fn([label, 1 - label], [label, 1 - label]))
        assert all(v == pytest.approx(100.0) for v in results.values()), results


def test_glue_labels_second_row(vocab, glue_dir):
    formats.register_glue(glue_dir, tasks=["cola", "stsb", "mnli"], vocabulary=vocab)
    assert _first("glue_cola", n=2)[1][1] == "unacceptable"
    assert _first("glue_stsb", n=2)[1][1] == "0.4"  # 0.5 -> nearest 0.2 (round half to even)
    assert _first("glue_mnli", "train", n=2)[1][1] == "entailment"
    post = seqio.get_mixture_or_task("glue_stsb").postprocess_fn
    assert post(b"3.2") == pytest.approx(3.2)


def test_superglue_from_official_jsonl(vocab, tmp_path):
    recs = {
        "BoolQ": {"question": "is it true", "passage": "It is.", "idx": 0, "label": True},
        "CB": {"premise": "It rained.", "hypothesis": "It was wet.", "label": "neutral",
               "idx": 0},
        "COPA": {"premise": "The man broke his toe.", "choice1": "He dropped a hammer.",
                 "choice2": "He sang.", "question": "cause", "label": 0, "idx": 0},
        "RTE": {"premise": "A is B.", "hypothesis": "B is A.", "label": "not_entailment",
                "idx": 0},
        # the official MultiRC line: a passage, its questions, their answer options
        "MultiRC": {"idx": 4, "version": 1.1, "passage": {"text": "Tom has a car.", "questions": [
            {"question": "What has Tom?", "idx": 6, "answers": [
                {"text": "a car", "idx": 8, "label": 1}, {"text": "a cat", "idx": 9,
                                                          "label": 0}]}]}},
        "WSC": {"text": "Mark told Pete he was late.", "idx": 0, "label": False, "target": {
            "span1_text": "Mark", "span1_index": 0, "span2_text": "he", "span2_index": 3}},
    }
    for d, rec in recs.items():
        for name in ("train.jsonl", "val.jsonl"):
            _write(str(tmp_path / d / name), [json.dumps(rec)])
    formats.register_superglue(str(tmp_path), vocabulary=vocab)
    assert _first("super_glue_boolq")[0][:2] == (
        "boolq passage: It is. question: is it true", "True")
    assert _first("super_glue_cb")[0][:2] == (
        "cb hypothesis: It was wet. premise: It rained.", "neutral")
    assert _first("super_glue_copa")[0][:2] == (
        "copa choice1: He dropped a hammer. choice2: He sang. premise: The man broke his toe. "
        "question: cause", "choice1")
    assert _first("super_glue_rte")[0][:2] == (
        "rte hypothesis: B is A. premise: A is B.", "not_entailment")
    multirc = _first("super_glue_multirc", n=2)
    assert [m[:2] for m in multirc] == [
        ("multirc question: What has Tom? answer: a car paragraph: Tom has a car.", "True"),
        ("multirc question: What has Tom? answer: a cat paragraph: Tom has a car.", "False")]
    assert [int(multirc[1][2][f"idx/{k}"]) for k in ("paragraph", "question", "answer")] == [
        4, 6, 9]
    assert _first("super_glue_wsc")[0][1] == "False"
    fns = seqio.get_mixture_or_task("super_glue_cb").metric_fns
    assert {k for fn in fns for k in fn([0, 1, 2], [0, 1, 1])} == {"accuracy", "mean_3class_f1"}


def test_squad_from_official_json(vocab, tmp_path):
    data = {"version": "1.1", "data": [{"title": "SB", "paragraphs": [{
        "context": "The Denver Broncos won Super Bowl 50.",
        "qas": [{"id": "q1", "question": "Who won?",
                 "answers": [{"text": "Denver Broncos", "answer_start": 4},
                             {"text": "The Denver Broncos", "answer_start": 0}]},
                {"id": "q2", "question": "Which game?",
                 "answers": [{"text": "Super Bowl 50", "answer_start": 23}]}]}]}]}
    (tmp_path / "dev-v1.1.json").write_text(json.dumps(data))
    formats.register_squad({"validation": str(tmp_path / "dev-v1.1.json")}, vocabulary=vocab)
    (inputs, targets, ex), (_, t2, _) = _first("squad_v010", n=2)
    assert inputs == "question: Who won? context: The Denver Broncos won Super Bowl 50."
    assert targets == "Denver Broncos" and t2 == "Super Bowl 50"
    task = seqio.get_mixture_or_task("squad_v010")
    refs = task.postprocess_fn(ex["targets_pretokenized"], example=ex, is_target=True)
    assert refs == ["Denver Broncos", "The Denver Broncos"]
    assert task.metric_fns[0]([refs], ["the denver broncos"]) == {"em": 100.0, "f1": 100.0}


def test_cnn_dailymail_stories_and_wmt(vocab, tmp_path):
    story = ["(CNN) -- A plane landed safely.", "", "Nobody was hurt.", "", "@highlight", "",
             "Plane lands safely", "", "@highlight", "", "Nobody hurt"]
    _write(str(tmp_path / "stories" / "a1.story"), story)
    formats.register_cnn_dailymail({"validation": str(tmp_path / "stories" / "*.story")},
                                   vocabulary=vocab)
    assert _first("cnn_dailymail")[0][:2] == (
        "summarize: (CNN) -- A plane landed safely. Nobody was hurt.",
        "Plane lands safely . Nobody hurt .")
    _write(str(tmp_path / "test.en"), ["Hello world.", "Thank you."])
    _write(str(tmp_path / "test.de"), ["Hallo Welt.", "Danke."])
    formats.register_wmt({"validation": (str(tmp_path / "test.en"), str(tmp_path / "test.de"))},
                         vocabulary=vocab)
    assert _first("wmt_t2t_ende")[0][:2] == (
        "translate English to German: Hello world.", "Hallo Welt.")
    assert seqio.get_mixture_or_task("wmt_t2t_ende").metric_fns == [metrics.bleu]


def test_missing_official_file_is_a_user_error(vocab, tmp_path):
    from t5lite.errors import UserError
    formats.register_glue(str(tmp_path), tasks=["rte"], vocabulary=vocab)
    with pytest.raises(UserError, match="does not exist"):
        _first("glue_rte")


# ----------------------------------------------------------------------------- the paper (TFDS)


def _tfds_fixture(data_dir, name, config, version, splits):
    """Write a real TFDS dataset (TFDS's own writer, the real builder's features) from a few
    examples: the registered builder then reads it like the prepared benchmark."""
    import tensorflow_datasets as tfds

    class Fixture(tfds.builder_cls(name), skip_registration=True):
        def _split_generators(self, dl_manager):
            del dl_manager
            return {s: ((i, ex) for i, ex in enumerate(exs)) for s, exs in splits.items()}

    Fixture.name = name
    kw = {"config": config} if config else {}
    Fixture(data_dir=data_dir, version=version, **kw).download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))


def write_paper_tfds(root: str) -> str:
    """The paper's data sets as small TFDS fixtures under root (a TFDS data dir)."""
    story = "The cat sat on the mat. It was warm."
    _tfds_fixture(root, "c4", "en", "3.1.0", {s: [
        {"text": f"document {i} about cats and dogs and the weather in the town " * 3,
         "url": "u", "timestamp": "t", "content-type": "text/plain", "content-length": "9"}
        for i in range(40)] for s in ("train", "validation")})
    _tfds_fixture(root, "glue", "sst2", "2.0.0", {s: [
        {"sentence": "a charming film", "label": 1, "idx": 0},
        {"sentence": "dull and slow", "label": 0, "idx": 1}] for s in ("train", "validation",
                                                                      "test")})
    _tfds_fixture(root, "super_glue", "record", "1.0.2", {s: [
        {"passage": "Paris is in France.\n@highlight\nIt is big", "query": "@placeholder is big",
         "entities": ["Paris", "France"], "answers": ["Paris", "France"],
         "idx": {"passage": 0, "query": 0}}] for s in ("train", "validation", "test")})
    _tfds_fixture(root, "super_glue", "wsc.fixed", "1.0.2", {s: [
        {"text": "Mark told Pete he was late.", "span1_text": "Mark", "span2_text": "he",
         "span1_index": 0, "span2_index": 3, "label": 0, "idx": 0},
        {"text": "Mark told Pete he was late.", "span1_text": "Pete", "span2_text": "he",
         "span1_index": 2, "span2_index": 3, "label": 1, "idx": 1},
        # one of WSC's texts whose pronoun index is one word off (T5 special-cases it)
        {"text": "Mr. Farley put the pebble in a safe . Some day they might want to use it , "
                 "but not now.", "span1_text": "pebble", "span2_text": "it",
         "span1_index": 4, "span2_index": 15, "label": 1, "idx": 2}]
        for s in ("train", "validation", "test")})
    _tfds_fixture(root, "definite_pronoun_resolution", None, "1.1.0", {s: [
        {"sentence": "Bob asked Tom if he can lend some money.", "pronoun": "he",
         "candidates": ["Bob", "Tom"], "label": 1}] for s in ("train", "test")})
    _tfds_fixture(root, "super_glue", "multirc", "1.0.2", {s: [
        {"paragraph": "<b>Sent 1: </b>Tom has a car.<br>", "question": "What does Tom have?",
         "answer": "a car", "label": 1, "idx": {"paragraph": 3, "question": 7, "answer": 9}}]
        for s in ("train", "validation", "test")})
    _tfds_fixture(root, "squad", "v1.1", "3.0.0", {s: [
        {"id": "q1", "title": "t", "question": "Where is the cat?", "context": story,
         "answers": {"text": ["on the mat", "the mat"], "answer_start": [12, 15]}}]
        for s in ("train", "validation")})
    _tfds_fixture(root, "cnn_dailymail", None, "3.4.0", {s: [
        {"article": story, "highlights": "The cat sat .", "id": "1", "publisher": "cnn"}]
        for s in ("train", "validation", "test")})
    _tfds_fixture(root, "wmt16_translate", "ro-en", "1.0.0", {s: [
        {"en": "The cat sleeps.", "ro": "Pisica doarme."}] for s in ("train", "validation",
                                                                     "test")})
    return root


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory, vocab):
    """The paper's data sets as small TFDS fixtures, and the paper tasks registered over them
    with the test vocabulary (restored to the t5 vocabulary afterwards)."""
    from t5lite.tasks import ablation_tasks
    root = write_paper_tfds(str(tmp_path_factory.mktemp("tfds")))
    seqio.set_tfds_data_dir_override(root)
    ablation_tasks.register_paper(vocab)
    yield root
    seqio.set_tfds_data_dir_override(None)
    ablation_tasks.register_paper("t5")


def test_paper_benchmarks_read_from_tfds(tfds_dir):
    assert _first("paper_glue_sst2")[0][:2] == ("sst2 sentence: a charming film", "positive")
    record = _first("paper_super_glue_record", n=2)  # one example per answer
    assert [r[1] for r in record] == ["Paris", "France"]
    assert record[0][0] == ("record query: @placeholder is big entities: Paris, France "
                            "passage: Paris is in France. It is big")
    assert [a.decode() for a in record[0][2]["answers"]] == ["Paris", "France"]
    assert record[1][2]["idx/passage"] == 0 and record[1][2]["idx/query"] == 0
    inputs, targets, ex = _first("paper_squad")[0]
    assert inputs.startswith("question: Where is the cat? context: The cat")
    assert targets == "on the mat" and [a.decode() for a in ex["answers"]] == [
        "on the mat", "the mat"]
    assert _first("paper_cnn_dailymail")[0][:2] == (
        "summarize: The cat sat on the mat. It was warm.", "The cat sat .")
    assert _first("paper_wmt_enro")[0][:2] == ("translate English to Romanian: The cat sleeps.",
                                              "Pisica doarme.")


def test_paper_wsc_dpr_and_multirc_are_t5s(tfds_dir):
    """WSC as T5's wsc_simple (the pronoun *marked*, the candidate noun as the target; training
    keeps the positive examples), DPR in the same form, MultiRC's question first and its
    markup gone (T5's preprocessors)."""
    wsc = sorted(_first("paper_super_glue_wsc", n=3), key=lambda w: w[2]["idx"])
    assert [w[:2] for w in wsc] == [
        ("wsc: Mark told Pete *he* was late.", "Mark"),
        ("wsc: Mark told Pete *he* was late.", "Pete"),
        ("wsc: Mr. Farley put the pebble in a safe . Some day they might want to use *it* , "
         "but not now.", "pebble")]
    assert [int(w[2]["label"]) for w in wsc] == [0, 1, 1]
    assert sorted(w[1] for w in _first("paper_super_glue_wsc_train", split="train", n=3)) == [
        "Pete", "pebble"]
    assert "train" not in seqio.get_mixture_or_task("paper_super_glue_wsc").splits
    assert _first("paper_super_glue_dpr", split="train")[0][:2] == (
        "wsc: Bob asked Tom if *he* can lend some money.", "Tom")
    inputs, targets, ex = _first("paper_super_glue_multirc")[0]
    assert (inputs, targets) == ("multirc question: What does Tom have? answer: a car "
                                 "paragraph: Sent 1: Tom has a car. ", "True")
    assert (ex["idx/paragraph"], ex["idx/question"], ex["idx/answer"]) == (3, 7, 9)
    task = seqio.get_mixture_or_task("paper_super_glue_multirc")
    assert task.postprocess_fn("True", example=ex, is_target=True) == {"value": 1,
                                                                       "group": (3, 7)}


def test_c4_pretraining_reads_from_tfds(tfds_dir, vocab):
    task = seqio.get_mixture_or_task("c4_iid_denoising")
    exs = list(task.get_dataset({"inputs": 32, "targets": 16}, split="train", shuffle=False)
               .take(4).as_numpy_iterator())
    assert len(exs) == 4
    sentinel = vocab.vocab_size - 1
    for e in exs:
        assert 0 < len(e["inputs"]) <= 32 and 0 < len(e["targets"]) <= 16
    assert any(sentinel in e["inputs"] for e in exs)
    mix = seqio.get_mixture_or_task("paper_multitask_k16")
    assert "c4_iid_denoising" in [t.name for t in mix.tasks]
