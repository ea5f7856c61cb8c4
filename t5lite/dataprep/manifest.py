"""DATA_DIR/MANIFEST.json: per dataset its recipe, files (bytes, sha256, lines), sources
(package, version, sha256) and build stats; whether a dataset is prepared; the build lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys

from t5lite.dataprep import datadir
from t5lite.dataprep.datasets import DATASETS
from t5lite.dataprep.fetch import sha256_file

MANIFEST = "MANIFEST.json"


def read_manifest(root: str) -> dict:
    path = os.path.join(root, MANIFEST)
    if not os.path.exists(path):
        return {"format": 1, "datasets": {}}
    with open(path) as f:
        return json.load(f)


def write_manifest(root: str, manifest: dict) -> None:
    path = os.path.join(root, MANIFEST)
    with open(path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def is_prepared(name: str, data_dir: str = "") -> bool:
    """True when the manifest lists `name` at the current recipe and its files have the
    recorded sizes."""
    root = datadir.data_dir(data_dir)
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
    root = datadir.data_dir(data_dir)
    bad = []
    for entry in read_manifest(root)["datasets"].values():
        for rel, info in entry["files"].items():
            p = os.path.join(root, rel)
            if not os.path.isfile(p) or sha256_file(p) != info["sha256"]:
                bad.append(rel)
    return bad


@contextlib.contextmanager
def lock(root: str):
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


def file_info(path: str) -> dict:
    with open(path, "rb") as f:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return {"bytes": os.path.getsize(path), "sha256": sha256_file(path),
            "lines": lines if not path.endswith(".model") else None}


def summary(data_dir: str = "") -> str:
    """A table of what is prepared: dataset, files, MB, lines, build seconds, sources."""
    root = datadir.data_dir(data_dir)
    rows = [f"{'dataset':18} {'MB':>7} {'lines':>9} {'secs':>6}  sources   ({root})"]
    for name, e in sorted(read_manifest(root)["datasets"].items()):
        mb = sum(f["bytes"] for f in e["files"].values()) / 1e6
        lines = sum(f["lines"] or 0 for f in e["files"].values())
        srcs = ", ".join(f"{s['package']} {s['version']}".strip() for s in e["sources"].values())
        rows.append(f"{name:18} {mb:7.1f} {lines:9d} {e['seconds']:6.0f}  {srcs}")
    return "\n".join(rows)
