"""Strict TFDS fixtures for the T5 paper's data sets: a few examples per split, on disk as real
TFDS datasets (tfrecords + dataset_info.json) that seqio.TfdsDataSource reads from a TFDS data
dir, offline.

As strict as the prepared data: each data set is written by TFDS's own writer through the
installed builder class, so the version must be one the builder knows, every example is
encoded with the builder's own features (a missing or extra key fails), and the data set holds
exactly the builder's own split names, read off its `_split_generators` with a download
manager that downloads nothing. (tfds.testing.mock_data would accept any split name.) As in
the real GLUE / SuperGLUE data, test splits carry no labels (-1; ReCoRD: no answers).
"""

from __future__ import annotations

import os
import tempfile

import tree

# Builders whose `_split_generators` need the real downloads to run (C4: a Beam pipeline over
# Common Crawl; CNN/DailyMail: the story archives' URL lists; Wikipedia: the dump's index;
# XSum: its split file's ids): their split names as that code names them
# (tensorflow_datasets/text/c4.py, wikipedia.py, summarization/cnn_dailymail.py, xsum.py;
# C4's single-language configs).
SPLITS_IN_CODE = {"c4": ("train", "validation"),
                  "cnn_dailymail": ("train", "validation", "test"),
                  "wikipedia": ("train",),
                  "xsum": ("train", "validation", "test")}
UNLABELED_TEST = ("glue", "super_glue")  # their test splits hold no labels

_STORY = "The cat sat on the mat. It was warm."
# WebQuestions' validation split is its train split past the paper's code's cut (the first
# 3,417 questions in TFDS's stored order train), pinned here apart from tasks/narang_tasks.py
WEBQ_TRAIN_EXAMPLES = 3417
# dataset (TFDS name/config, or a name whose configs share features; no version) -> a few
# labelled examples with the builder's features, the same in every split or {split: examples}
EXAMPLES = {
    "glue/cola": [{"sentence": "The cat sat.", "label": 1, "idx": 0},
                  {"sentence": "Sat cat the.", "label": 0, "idx": 1}],
    "glue/sst2": [{"sentence": "a charming film", "label": 1, "idx": 0},
                  {"sentence": "dull and slow", "label": 0, "idx": 1}],
    "glue/mrpc": [{"sentence1": "He left.", "sentence2": "He went away.", "label": 1, "idx": 0},
                  {"sentence1": "He left.", "sentence2": "It rained.", "label": 0, "idx": 1}],
    "glue/qqp": [{"question1": "Why?", "question2": "For what reason?", "label": 1, "idx": 0},
                 {"question1": "Who?", "question2": "Where?", "label": 0, "idx": 1}],
    "glue/stsb": [{"sentence1": "A dog runs.", "sentence2": "A dog is running.", "label": 4.6,
                   "idx": 0},
                  {"sentence1": "A dog runs.", "sentence2": "It is noon.", "label": 0.4,
                   "idx": 1}],
    "glue/mnli": [{"premise": "A man eats.", "hypothesis": "A man is eating.", "label": 0,
                   "idx": 0},
                  {"premise": "A man eats.", "hypothesis": "He is hungry.", "label": 1,
                   "idx": 1},
                  {"premise": "A man eats.", "hypothesis": "Nobody eats.", "label": 2,
                   "idx": 2}],
    "glue/qnli": [{"question": "Where is the cat?", "sentence": "The cat is on the mat.",
                   "label": 0, "idx": 0},
                  {"question": "Where is the cat?", "sentence": "It rained.", "label": 1,
                   "idx": 1}],
    "glue/rte": [{"sentence1": "Paris is in France.", "sentence2": "France has Paris.",
                  "label": 0, "idx": 0},
                 {"sentence1": "Paris is in France.", "sentence2": "Paris is in Peru.",
                  "label": 1, "idx": 1}],
    "glue/wnli": [{"sentence1": "The cup fell because it was full.",
                   "sentence2": "The cup was full.", "label": 1, "idx": 0},
                  {"sentence1": "The cup fell because it was full.",
                   "sentence2": "The table was full.", "label": 0, "idx": 1}],
    "super_glue/boolq": [{"question": "is paris in france", "passage": "Paris is in France.",
                          "label": 1, "idx": 0},
                         {"question": "is paris in peru", "passage": "Paris is in France.",
                          "label": 0, "idx": 1}],
    "super_glue/cb": [{"premise": "It rained.", "hypothesis": "It was wet.", "label": 0,
                       "idx": 0},
                      {"premise": "It rained.", "hypothesis": "It was dry.", "label": 1,
                       "idx": 1},
                      {"premise": "It rained.", "hypothesis": "It was late.", "label": 2,
                       "idx": 2}],
    "super_glue/copa": [{"premise": "The glass fell.", "choice1": "It broke.",
                         "choice2": "It sang.", "question": "effect", "label": 0, "idx": 0},
                        {"premise": "The man slept.", "choice1": "He ran.",
                         "choice2": "He was tired.", "question": "cause", "label": 1,
                         "idx": 1}],
    "super_glue/multirc": [
        {"paragraph": "Tom has a red car and a blue bike.", "question": "What does Tom have?",
         "answer": answer, "label": label,
         "idx": {"paragraph": 0, "question": 0, "answer": i}}
        for i, (answer, label) in enumerate([("a red car", 1), ("a boat", 0),
                                             ("a blue bike", 1)])],
    "super_glue/record": [
        {"passage": "Paris is in France.\n@highlight\nIt is big", "query": "@placeholder is big",
         "entities": ["Paris", "France"], "answers": ["Paris"],
         "idx": {"passage": 0, "query": 0}},
        {"passage": "Rome is in Italy.\n@highlight\nIt is old", "query": "@placeholder is old",
         "entities": ["Rome", "Italy"], "answers": ["Rome", "Italy"],
         "idx": {"passage": 1, "query": 1}}],
    "super_glue/rte": [{"premise": "Paris is in France.", "hypothesis": "France has Paris.",
                        "label": 0, "idx": 0},
                       {"premise": "Paris is in France.", "hypothesis": "Paris is in Peru.",
                        "label": 1, "idx": 1}],
    "super_glue/wic": [{"word": "bank", "sentence1": "The river bank.",
                        "sentence2": "The bank lent money.", "start1": 10, "end1": 14,
                        "start2": 4, "end2": 8, "label": 0, "idx": 0},
                       {"word": "run", "sentence1": "I run fast.", "sentence2": "They run far.",
                        "start1": 2, "end1": 5, "start2": 5, "end2": 8, "label": 1, "idx": 1}],
    "super_glue/wsc.fixed": [
        {"text": "Mark told Pete he was late.", "span1_text": "Pete", "span2_text": "he",
         "span1_index": 2, "span2_index": 3, "label": 1, "idx": 0},
        {"text": "The cup fell off the table because it was round.", "span1_text": "table",
         "span2_text": "it", "span1_index": 5, "span2_index": 7, "label": 0, "idx": 1}],
    "definite_pronoun_resolution": [
        {"sentence": "The cup fell off the table because it was full.", "pronoun": "it",
         "candidates": ["The cup", "the table"], "label": 0},
        {"sentence": "Mark told Pete that he was late.", "pronoun": "he",
         "candidates": ["Mark", "Pete"], "label": 1}],
    "squad/v1.1": [
        {"id": "q1", "title": "Cats", "question": "Where is the cat?", "context": _STORY,
         "answers": {"text": ["on the mat", "the mat"], "answer_start": [12, 15]}},
        {"id": "q2", "title": "Cats", "question": "How was it?", "context": _STORY,
         "answers": {"text": ["warm"], "answer_start": [31]}}],
    "cnn_dailymail": [{"article": _STORY, "highlights": "The cat sat .", "id": "1",
                       "publisher": "cnn"},
                      {"article": "It rained all day in the town.", "highlights": "It rained .",
                       "id": "2", "publisher": "dm"}],
    "wmt_t2t_translate/de-en": [{"en": "The cat sleeps.", "de": "Die Katze schläft."},
                                {"en": "Good morning.", "de": "Guten Morgen."}],
    "wmt14_translate/fr-en": [{"en": "The cat sleeps.", "fr": "Le chat dort."},
                              {"en": "Good morning.", "fr": "Bonjour."}],
    "wmt16_translate/ro-en": [{"en": "The cat sleeps.", "ro": "Pisica doarme."},
                              {"en": "Good morning.", "ro": "Bună dimineața."}],
    "xsum": [{"document": "The council said the bridge would close for repairs on Monday. "
                          "Drivers were told to use the ring road.",
              "summary": "A town bridge is to close for repairs."},
             {"document": "Heavy rain flooded the high street overnight. Shops stayed shut.",
              "summary": "Floods have closed shops on a high street."}],
    # the train split reaches 2 questions past the cut; some questions have several answers
    "web_questions": {
        "train": [{"url": f"http://www.freebase.com/view/en/town_{i}",
                   "question": f"where is town {i}?",
                   "answers": [f"County {i}", f"Region {i}"][:1 + i % 2]}
                  for i in range(WEBQ_TRAIN_EXAMPLES + 2)],
        "test": [{"url": "http://www.freebase.com/view/en/rome", "question": "where is rome?",
                  "answers": ["Italy", "Lazio"]}]},
    # every Wikipedia dump and language has these features
    "wikipedia": [{"title": f"Town {i}", "text": f"Town {i} is a town by the river. " * 4}
                  for i in range(100)],  # a 1% slice (its held-out validation) is one
    # every C4 config (en, en.noclean, realnewslike, ...) has these features
    "c4": [{"text": f"Document {i} about cats and dogs and the weather in the town. " * 3,
               "url": f"https://example.com/{i}", "timestamp": "2019-04-25T12:00:00Z",
               "content-type": "text/plain", "content-length": "180"} for i in range(40)],
}


def parse_name(tfds_name: str) -> tuple[str, str, str]:
    """"glue/mnli:2.0.0" -> ("glue", "mnli", "2.0.0"); no config: ("", ...)."""
    name, _, version = tfds_name.partition(":")
    name, _, config = name.partition("/")
    return name, config, version


class _StandInDownloads:
    """A download manager that downloads nothing: each URL becomes a path that is never read
    (split generators only build generators over their files)."""

    def __init__(self, root: str):
        from etils import epath
        self.root = epath.Path(root)
        self.download_dir = self.manual_dir = self.root

    def download_and_extract(self, urls):
        return tree.map_structure(lambda _: self.root / "not-downloaded", urls)

    download = extract = download_and_extract


def _builder(name: str, config: str, **kw):
    import tensorflow_datasets as tfds
    return tfds.builder_cls(name)(**({"config": config} if config else {}), **kw)


def builder_splits(tfds_name: str) -> tuple[str, ...]:
    """The split names the installed TFDS builder generates for ``tfds_name``."""
    name, config, _ = parse_name(tfds_name)
    if name in SPLITS_IN_CODE:
        return SPLITS_IN_CODE[name]
    with tempfile.TemporaryDirectory() as tmp:
        generators = _builder(name, config, data_dir=tmp)._split_generators(  # noqa: SLF001
            _StandInDownloads(tmp))
    names = generators if isinstance(generators, dict) else [g.name for g in generators]
    return tuple(str(s) for s in names)


def _split_examples(dataset: str, split: str) -> list[dict]:
    examples = EXAMPLES[dataset]
    if isinstance(examples, dict):
        return examples[split]
    if not split.startswith("test") or dataset.split("/")[0] not in UNLABELED_TEST:
        return examples
    if dataset == "super_glue/record":
        return [{**ex, "answers": []} for ex in examples]
    return [{**ex, "label": -1} for ex in examples]


def write(data_dir: str, tfds_name: str) -> tuple[str, ...]:
    """Write ``tfds_name`` (name[/config]:version) under the TFDS data dir ``data_dir`` with
    every split of the builder; -> the split names."""
    import tensorflow_datasets as tfds
    name, config, version = parse_name(tfds_name)
    dataset = f"{name}/{config}" if config else name
    dataset = dataset if dataset in EXAMPLES else name  # a family's configs share features
    if dataset not in EXAMPLES:
        raise KeyError(f"tests/tfds_fixtures.py has no examples for {dataset}: add a few with "
                       "the builder's features to EXAMPLES.")
    splits = builder_splits(tfds_name)

    class Fixture(tfds.builder_cls(name), skip_registration=True):
        def _split_generators(self, dl_manager):
            del dl_manager
            return {s: enumerate(_split_examples(dataset, s)) for s in splits}

    Fixture.name = name  # the registered builder's directory under data_dir
    Fixture(data_dir=data_dir, version=version, **({"config": config} if config else {})
            ).download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    return splits


def write_all(data_dir: str, tfds_names) -> str:
    """Every data set of ``tfds_names`` under data_dir (once each); -> data_dir."""
    import tensorflow_datasets as tfds
    tfds.disable_progress_bar()
    for tfds_name in sorted(set(tfds_names)):
        name, config, version = parse_name(tfds_name)
        if not os.path.exists(os.path.join(data_dir, name, config, version)):
            write(data_dir, tfds_name)
    return data_dir
