"""The bare worker's package index: a find-links folder of wheels made from this test's own venv.

A TPU worker installs uv and t5lite[tpu] from PyPI; tests are offline and 4 GB of wheels would
take minutes to zip and unzip. So the index is stood in, and only the index:

- every distribution installed here gets a wheel with its real METADATA (name, version,
  Requires-Dist with extras and markers), its WHEEL tags and its entry points, so pip / uv
  resolve and install t5lite[tpu]'s real requirement tree offline and write its scripts;
- such a wheel's files are one `.pth` line naming a folder of symlinks to that distribution's
  own files in this venv (a shared folder such as google/ is split file by file): the new venv
  sees exactly the distributions that were installed into it, no more (no pip, no torch);
- uv itself is repacked whole (its binary in the wheel's scripts), so `pip install --user uv`
  installs the real uv that setup then runs.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata as md
import io
import os
import re
import sys
import sysconfig
import zipfile

FULL = {"uv"}  # repacked with their files: they run outside the venv (pip --user, by python3)
SKIP = {"t5lite"}  # the project itself: setup installs it from the shipped source (-e .)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _record_line(arc: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [arc, f"sha256={digest}", str(len(data))]


def _write_wheel(path: str, members: dict[str, bytes], dist_info: str) -> None:
    rows = [_record_line(arc, data) for arc, data in members.items()]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows + [[f"{dist_info}/RECORD", "", ""]])
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for arc, data in members.items():
            entry = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            entry.external_attr = (0o100755 if ".data/scripts/" in arc else 0o100644) << 16
            z.writestr(entry, data)
        z.writestr(f"{dist_info}/RECORD", out.getvalue())


def _tags(dist) -> list[str]:
    tags = [ln.split(":", 1)[1].strip() for ln in (dist.read_text("WHEEL") or "").splitlines()
            if ln.startswith("Tag:")]
    return tags or ["py3-none-any"]


def _wheel_name(dist) -> str:
    parts = [t.split("-") for t in _tags(dist)]
    tag = "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))
    return f"{_norm(dist.metadata['Name'])}-{dist.version}-{tag}.whl"


def _site_files(dist) -> list[str]:
    """The distribution's files under site-packages (not its dist-info, scripts or caches)."""
    files = [str(f) for f in dist.files or ()]
    info = next(f.split("/")[0] + "/" for f in files if f.endswith(".dist-info/RECORD"))
    return [f for f in files if not f.startswith(("..", info)) and "__pycache__" not in f]


def _owners(dists) -> dict[str, set]:
    """site-packages-relative folder -> the distributions with files below it."""
    owners: dict[str, set] = {}
    for dist in dists:
        name = dist.metadata["Name"]  # parsed on every access
        for rel in _site_files(dist):
            parts = rel.split("/")
            for i in range(1, len(parts)):
                owners.setdefault("/".join(parts[:i]), set()).add(name)
    return owners


def _link_tree(site: str, shadow: str, name: str, files: list[str], owners: dict) -> None:
    """Symlink name's files into shadow: a whole folder when name alone owns it, else the
    folder's own entries one by one."""
    done = set()
    for rel in files:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            head = "/".join(parts[:i])
            if i < len(parts) and owners.get(head) != {name}:
                os.makedirs(os.path.join(shadow, head), exist_ok=True)
                continue
            if head not in done and os.path.lexists(os.path.join(site, head)):
                os.symlink(os.path.join(site, head), os.path.join(shadow, head))
            done.add(head)
            break


def _full_members(dist, info: str) -> dict[str, bytes]:
    data = f"{info[:-len('.dist-info')]}.data/scripts/"
    members = {}
    for f in dist.files or ():
        rel = str(f)
        if rel.startswith(info) or "__pycache__" in rel:
            continue
        arc = data + os.path.basename(rel) if rel.startswith("..") else rel
        members[arc] = f.locate().read_bytes()
    return members


def build(out: str) -> str:
    """Writes OUT/wheels/*.whl (and OUT/files/<dist>/, their symlinks); returns OUT/wheels."""
    site = sysconfig.get_paths()["purelib"]
    dists = {d.metadata["Name"]: d for d in md.distributions(path=[site])}
    dists = [d for n, d in sorted(dists.items()) if _norm(n) not in SKIP]
    owners = _owners(dists)
    wheels = os.path.join(out, "wheels")
    os.makedirs(wheels, exist_ok=True)
    for dist in dists:
        name, key = dist.metadata["Name"], _norm(dist.metadata["Name"])
        info = f"{key}-{dist.version}.dist-info"
        members = {}
        if key in FULL:
            members.update(_full_members(dist, info))
        else:
            shadow = os.path.join(out, "files", key)
            os.makedirs(shadow, exist_ok=True)
            files = _site_files(dist)
            _link_tree(site, shadow, name, files, owners)
            members[f"_bare_worker_{key}.pth"] = (shadow + "\n").encode()
            for rel in files:  # a distribution's own .pth (e.g. setuptools' distutils shim)
                if "/" not in rel and rel.endswith(".pth"):
                    with open(os.path.join(site, rel), "rb") as f:
                        members[rel] = f.read()
        members[f"{info}/METADATA"] = dist.read_text("METADATA").encode()
        tags = "".join(f"Tag: {t}\n" for t in _tags(dist))
        purelib = "false" if key in FULL else "true"
        members[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: bare_worker\n"
                                    f"Root-Is-Purelib: {purelib}\n{tags}").encode()
        if dist.read_text("entry_points.txt"):
            members[f"{info}/entry_points.txt"] = dist.read_text("entry_points.txt").encode()
        _write_wheel(os.path.join(wheels, _wheel_name(dist)), members, info)
    return wheels


if __name__ == "__main__":
    print(build(sys.argv[1]))
