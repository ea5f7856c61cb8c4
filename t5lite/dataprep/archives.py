"""Members of downloaded package archives (.deb, .tgz / .tar.gz, .whl / .zip)."""

from __future__ import annotations

import os
import subprocess
import tarfile
import zipfile
from typing import Callable

from t5lite.errors import UserError


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
