"""Prepared datasets packed for machines that cannot build them (TPU workers).

    python -m t5lite.dataprep.bundle ARCHIVE NAME...

builds what is missing here (`t5lite data prepare` semantics), then writes ARCHIVE (.tar.gz):
the files of NAME and of what it depends on, and MANIFEST.json, laid out relative to the data
dir, so that unpacking it into a worker's data dir makes `is_prepared` true there.
launch/tpu/data_ship.py runs it and copies ARCHIVE to every worker.
"""

from __future__ import annotations

import os
import sys
import tarfile

from t5lite.dataprep import manifest as manifest_lib
from t5lite.dataprep.build import ensure_prepared, resolve
from t5lite.errors import UserError


def bundle(archive: str, names: list, data_dir: str = "") -> list:
    """Writes archive; -> the dataset names it holds (dependencies included)."""
    if not names:
        raise UserError("name the datasets to ship, e.g. `quickstart` or `vocab_t5 corpus`.")
    root = ensure_prepared(names, data_dir)
    order = resolve(names)[0]
    datasets = manifest_lib.read_manifest(root)["datasets"]
    tmp = archive + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for name in order:
            for rel in sorted(datasets[name]["files"]):
                tar.add(os.path.join(root, rel), arcname=rel)
        tar.add(os.path.join(root, manifest_lib.MANIFEST), arcname=manifest_lib.MANIFEST)
    os.replace(tmp, archive)
    return order


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: python -m t5lite.dataprep.bundle ARCHIVE NAME...", file=sys.stderr)
        return 2
    try:
        order = bundle(argv[0], argv[1:])
    except UserError as e:
        print(f"t5lite: error: {e}", file=sys.stderr)
        return 2
    mb = os.path.getsize(argv[0]) / 1e6
    print(f"t5lite: packed {', '.join(order)} into {argv[0]} ({mb:.1f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
