"""gs:// I/O: which library carries each access, and the object operations a filesystem API
cannot express (conditional writes for the workdir lock, appends).

Every gs:// byte of a run goes through a library that honours STORAGE_EMULATOR_HOST, so the
whole path is testable against a GCS emulator (tests/gcs_emulator.py) and the one setting
moves all of it:
    epath (config.json, metrics, goodput, lock reads; orbax's own metadata)  -> gcsfs
    orbax arrays                                                             -> tensorstore
    TensorBoard events (tensorboardX), lock writes, appends                  -> google-cloud-storage
TensorFlow's own GCS filesystem (tf.io.gfile, tf.train.Checkpoint) talks to a fixed endpoint
and honours no emulator setting, so epath is told not to use it (EPATH_USE_TF=false) and the
tf.data iterator state is written to a local folder and copied (`staged_upload`,
`staged_download`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import shutil
import tempfile
import uuid

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def emulator_url() -> str:
    """The emulator's URL when STORAGE_EMULATOR_HOST names one, else ''."""
    host = os.environ.get(EMULATOR_ENV, "")
    if host in ("", "default"):
        return ""
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


def configure() -> None:
    """Route gs:// as the module docstring says; idempotent. Called by the entry points that
    reach gs:// (the CLI's main, `paths.abspath` of a gs:// path, this module's object
    operations), before epath picks a backend for a gs:// path (it caches the choice) and
    before gcsfs is imported (it reads its flag then); never at import. Settings already in
    the environment win."""
    os.environ.setdefault("EPATH_USE_TF", "false")
    # gcsfs's zonal-bucket probe is a gRPC call per bucket that an emulator cannot answer
    # (a minute's timeout each); t5lite writes no zonal-only features
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    _core_gcsfs_if_imported()
    url = emulator_url()
    if url:
        # one switch for every library: tensorstore alone would otherwise write the arrays of
        # a checkpoint to real GCS while its metadata went to the emulator
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url)
        import fsspec.config
        # emulators take no credentials; gcsfs's default search would probe the GCE metadata
        # server (google-cloud-storage does the same on its own)
        fsspec.config.conf.setdefault("gcs", {}).setdefault("token", "anon")


def _core_gcsfs_if_imported() -> None:
    """gcsfs imported before configure() (by another library, a notebook, a test) read its
    flag then and serves gs:// with its zonal-bucket class: register the core class for gs://
    as the flag now asks, so the import order does not decide (fsspec resolves a protocol's
    class on each new filesystem)."""
    if "gcsfs" not in sys.modules or os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"].lower() in (
            "true", "1"):
        return
    import fsspec
    import gcsfs.core
    for protocol in ("gs", "gcs"):
        fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)


def is_gcs(path) -> bool:
    return os.fspath(path).startswith("gs://")


def split(url) -> tuple[str, str]:
    """'gs://bucket/a/b' -> ('bucket', 'a/b')."""
    bucket, _, name = os.fspath(url)[len("gs://"):].partition("/")
    return bucket, name


@functools.lru_cache(maxsize=1)
def client():
    """A google-cloud-storage client: the VM's credentials, or anonymous on an emulator."""
    configure()
    from google.cloud import storage
    return storage.Client()


def blob(url):
    bucket, name = split(url)
    return client().bucket(bucket).blob(name)


def _precondition_failed():
    from google.api_core import exceptions
    return exceptions.PreconditionFailed


def _not_found():
    from google.api_core import exceptions
    return exceptions.NotFound


# ---------------------------------------------------------------------- conditional writes


def read(url, attempts: int = 5):
    """-> (bytes, generation, updated epoch seconds), or (None, None, None) when absent. The
    bytes are those of that generation (a write in between: read again)."""
    bucket, name = split(url)
    for _ in range(attempts):
        b = client().bucket(bucket).get_blob(name)
        if b is None:
            return None, None, None
        try:
            data = b.download_as_bytes(if_generation_match=b.generation)
        except _not_found():
            return None, None, None
        except _precondition_failed():
            continue
        return data, b.generation, (b.updated.timestamp() if b.updated else None)
    raise OSError(f"could not read {url}: it kept changing under {attempts} attempts")


def write_if(url, data: bytes, generation: int):
    """Write `data` only if the object's generation is `generation` (0: only if absent).
    -> the new generation, or None when another writer got there first."""
    b = blob(url)
    try:
        b.upload_from_string(data, if_generation_match=generation)
    except _precondition_failed():
        return None
    return b.generation


def delete_if(url, generation: int) -> bool:
    """Delete the object only if it still has `generation`. -> whether it was deleted."""
    b = blob(url)
    try:
        # GCS applies the precondition atomically; the check first keeps a server that ignores
        # it on deletes (fake-gcs-server 1.54) from deleting another writer's object but for
        # the moment between the two calls
        b.reload()
        if b.generation != generation:
            return False
        b.delete(if_generation_match=generation)
    except (_precondition_failed(), _not_found()):
        return False
    return True


def append(url, data: bytes, attempts: int = 5) -> None:
    """Append to an object: upload the piece, compose [object, piece] onto the object under a
    generation precondition (GCS objects cannot be appended to; gcsfs opens "a" as "w", which
    would drop every earlier line)."""
    for _ in range(attempts):
        dst = blob(url)
        try:
            dst.reload()
        except _not_found():
            if write_if(url, data, 0) is not None:
                return
            continue
        piece = blob(f"{url}.append-{uuid.uuid4().hex[:12]}")
        piece.upload_from_string(data, if_generation_match=0)
        try:
            dst.compose([dst, piece], if_generation_match=dst.generation)
            return
        except _precondition_failed():
            continue  # another writer changed it between reload and compose: again
        finally:
            with contextlib.suppress(_not_found()):
                piece.delete()
    raise OSError(f"could not append to {url}: it kept changing under {attempts} attempts")


def move(src, dst) -> None:
    """A gs:// object or folder -> dst (copies, then deletes: GCS renames nothing)."""
    configure()
    import fsspec
    fsspec.filesystem("gs").mv(os.fspath(src), os.fspath(dst), recursive=True)


# ---------------------------------------------------------------------- staged folders


@contextlib.contextmanager
def staged_upload(remote: str):
    """A local temp folder whose files are copied to `remote` (a flat gs:// folder) when the
    block ends without error: for writers that reach GCS only through TensorFlow's own
    filesystem (tf.train.Checkpoint)."""
    configure()
    from etils import epath
    local = tempfile.mkdtemp(prefix="t5lite-gcs-")
    try:
        yield local
        dst = epath.Path(remote)
        for name in sorted(os.listdir(local)):
            with open(os.path.join(local, name), "rb") as f:
                (dst / name).write_bytes(f.read())
    finally:
        shutil.rmtree(local, ignore_errors=True)


@contextlib.contextmanager
def staged_download(remote: str, names_only: bool = False):
    """A local temp copy of the flat gs:// folder `remote` (missing: an empty folder), for
    readers that reach GCS only through TensorFlow's filesystem. names_only: one level of
    subfolders deep, empty files with the remote names (for a reader that only lists)."""
    configure()
    from etils import epath
    local = tempfile.mkdtemp(prefix="t5lite-gcs-")
    try:
        src = epath.Path(remote)
        if src.is_dir():
            for child in src.iterdir():
                target = os.path.join(local, child.name)
                if child.is_dir():
                    os.makedirs(target, exist_ok=True)
                    if names_only:
                        for grandchild in child.iterdir():
                            open(os.path.join(target, grandchild.name), "wb").close()
                elif names_only:
                    open(target, "wb").close()
                else:
                    with open(target, "wb") as f:
                        f.write(child.read_bytes())
        yield local
    finally:
        shutil.rmtree(local, ignore_errors=True)
