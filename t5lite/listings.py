"""`t5lite models` and `t5lite tasks list` in about a second.

Both listings depend only on code: the parameter counts on the model and config sources, the
task table on the task sources (whose import loads TensorFlow: seconds). They are computed
once and kept in `$T5LITE_CACHE_DIR` (default ~/.cache/t5lite/listings), keyed by a digest of
those sources and the library versions, so an edit or an upgrade recomputes them. Whether a
task's data is prepared is checked on every call (a file check, no TensorFlow).
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import json
import os
from importlib import metadata

ROOT = os.path.dirname(os.path.abspath(__file__))


def cache_dir() -> str:
    return os.environ.get("T5LITE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "t5lite",
        "listings")


def _digest(patterns, packages, extra="") -> str:
    h = hashlib.sha256(extra.encode())
    for pkg in packages:
        try:
            h.update(f"{pkg}={metadata.version(pkg)}".encode())
        except metadata.PackageNotFoundError:
            h.update(pkg.encode())
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            h.update(path.encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def cached(name: str, key: str, build):
    """build() (JSON-able), kept in cache_dir()/name.json under `key`."""
    path = os.path.join(cache_dir(), name + ".json")
    try:
        with open(path) as f:
            entry = json.load(f)
        if entry.get("key") == key:
            return entry["value"]
    except (OSError, ValueError):
        pass
    value = build()
    try:  # a read-only home only costs the speed-up
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump({"key": key, "value": value}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass
    return value


def dataset_names() -> list[str]:
    from t5lite import dataprep
    return list(dataprep.DATASETS)


def models_table(names=()) -> str:
    from t5lite import config as config_lib
    key = _digest([os.path.join(ROOT, "models", "*.py"), os.path.join(ROOT, "config.py"),
                   os.path.join(config_lib.configs_dir(), "*.py")], ("jax", "flax"),
                  extra=json.dumps(list(names)))

    def build():
        from t5lite.models import param_count_table
        return param_count_table(list(names) or None)
    return cached("models", key, build)


def tasks_table() -> str:
    """inspect.task_rows() (cached) with a `data` column: ready, or the datasets to prepare."""
    key = _digest([os.path.join(ROOT, "tasks", "*.py")], ("seqio", "tensorflow"))

    def build():
        from t5lite.cli import _import_tensorflow_quietly
        _import_tensorflow_quietly()
        from t5lite.tasks import inspect
        return inspect.task_rows()
    rows = cached("tasks", key, build)
    from t5lite import dataprep as ld
    status = {}

    def data(needs):
        missing = []
        for n in needs:
            if n not in status:
                status[n] = ld.is_prepared(n)
            if not status[n]:
                missing.append(n)
        return "ready" if not missing else "prepare " + ",".join(missing)

    table = [["name", "kind", "features", "vocabulary", "metrics / members", "data"]]
    table += [r["cells"] + [data(r["needs"]) if r["needs"] else "-"] for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"data: prepared under {ld.data_dir()}; build what is missing with "
                 "`t5lite data prepare NAME ...`.")
    return "\n".join(lines)
