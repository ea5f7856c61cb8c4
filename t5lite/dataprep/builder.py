"""What one dataset recipe gets: the Builder (output root, fetcher, the record of the sources it
read and its stats), an atomic writer for its files, and SourceFetcher for the source parsers.
Its own module so that both kinds of recipe (datasets, vocab) import it from below."""

from __future__ import annotations

import glob
import hashlib
import os

from t5lite.dataprep.fetch import SOURCES, Fetcher, Source, sha256_file


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


class SourceFetcher:
    """Adapter so the docs_* readers can record the sources they fetch in the Builder."""

    def __init__(self, b: Builder):
        self.b = b

    def fetch(self, source: Source):
        key = next(k for k, v in SOURCES.items() if v == source)
        return self.b.fetch(key), ""
