"""Paths a run writes: local or gs:// (through epath), and writes that never leave half a file."""

from __future__ import annotations

import os

from etils import epath

from t5lite.store import gcs


def abspath(path: str) -> str:
    """Absolute local path; URLs (gs://bucket/dir) unchanged. Workdirs may be either, so file
    I/O here goes through epath (orbax, tf.train.Checkpoint take both), never os / open().
    A gs:// path routes gs:// first (gcs.configure): every run's workdir passes here."""
    if gcs.is_gcs(path):
        gcs.configure()
    return path if "://" in path else os.path.abspath(path)


def write_atomic(path, text: str) -> None:
    """Write `text` to a sibling temp file, then rename it over `path`: a crash or a full disk
    leaves the old file whole (rename is atomic on POSIX; gs:// objects appear whole)."""
    path = epath.Path(path)
    tmp = path.parent / f".{path.name}.tmp"
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
