"""A fresh TPU VM image to run launch/tpu_vm.py's worker-side commands in, as hard as the real one.

What a TPU image (Ubuntu 22.04, `tpu-ubuntu2204-base`, `v2-alpha-*`) gives an ssh session, and
so what this sandbox gives its commands: a home of its own; on PATH only bash, coreutils, tar
/ gzip, util-linux's flock / setsid, procps, git and the system `python3` with pip at system
level (3.10 there: a python3.10 from this machine when there is one, else this machine's
system python3, said by `SYSTEM_PYTHON`); no npm or node; an `apt-get` that fails as apt does
for a user without root and without package lists. No t5lite dependency is installed anywhere
the sandbox can see: a venv made in it has no pip and sees only what is installed into it.

Stood in (documented in tests/bare_worker/__init__.py): the package index (wheelhouse.py, an
offline find-links folder for pip and uv) and the CPython that `uv venv --python X` downloads
on a real worker (a `pythonX` on PATH, the interpreter this test runs on: the stand-in wheels'
compiled files are built for it).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

TOOLS = ("bash sh env cat date dirname basename echo grep egrep head tail tr ln ls mkdir mktemp "
         "mv cp rm rmdir readlink realpath seq sleep sort stat touch uname wc kill setsid flock "
         "hostname tar gzip id chmod sed awk pkill ps nproc getconf git true false test expr "
         "cut tee xargs find which").split()

APT_GET = """#!/bin/bash
# apt on a fresh TPU VM, for the ssh user: no package lists until `sudo apt-get update`
for a in "$@"; do last="$a"; done
case "${1:-}" in
    update|install|upgrade)
        echo "E: Could not open lock file /var/lib/apt/lists/lock - open (13: Permission" \
             "denied)" >&2
        echo "E: Unable to lock directory /var/lib/apt/lists/" >&2 ;;
    *) echo "E: Unable to locate package ${last:-}" >&2 ;;
esac
exit 100
"""


def _has_pip(python: str) -> bool:
    return subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0


def system_python() -> str:
    """A python3.10 with pip (the TPU images' system Python), else this machine's system
    python3 with pip (Debian's 3.11: PEP 668 makes setup take its --break-system-packages
    branch), else the interpreter under this test."""
    base = os.path.dirname(os.path.dirname(os.path.realpath(sys._base_executable)))
    candidates = ["/usr/bin/python3.10", *sorted(glob.glob(os.path.join(
        os.path.dirname(base), "3.10*", "bin", "python3.10"))), "/usr/bin/python3"]
    for python in candidates:
        if os.path.exists(python) and _has_pip(python):
            return python
    return os.path.realpath(sys._base_executable)


def venv_python() -> tuple[str, str]:
    """(X.Y, interpreter): what the stand-in for uv's CPython download offers."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}", os.path.realpath(sys._base_executable)


def make(root: str, wheels: str) -> dict:
    """The image under root (bin/, home/); -> the environment of an ssh session there."""
    bindir, home = os.path.join(root, "bin"), os.path.join(root, "home")
    os.makedirs(bindir)
    os.makedirs(home)
    for tool in TOOLS:
        path = shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        if path:
            os.symlink(path, os.path.join(bindir, tool))
    os.symlink(system_python(), os.path.join(bindir, "python3"))
    version, python = venv_python()
    os.symlink(python, os.path.join(bindir, f"python{version}"))
    with open(os.path.join(bindir, "apt-get"), "w") as f:
        f.write(APT_GET)
    os.chmod(os.path.join(bindir, "apt-get"), 0o755)
    return {
        "PATH": bindir, "HOME": home, "USER": "tpu-user", "LANG": "C.UTF-8",
        # the index stand-in, for pip (no config file of this machine) and for uv
        "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": wheels,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1", "UV_OFFLINE": "1", "UV_FIND_LINKS": wheels,
        "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never",
        "UV_CACHE_DIR": os.path.join(root, "uv-cache"), "UV_LINK_MODE": "copy",
        # tpu_job.sh: which worker this is, and the libtpu lock file (as fake_gcloud.py sets)
        "T5LITE_WORKER": "0", "T5LITE_TPU_LOCKFILE": os.path.join(root, "libtpu_lockfile"),
    }
