"""The suite never reads or writes the user's prepared data (issue: a red suite on a fresh
machine, and vocabularies written into the real ~/.cache/t5lite by a test run).

`sandbox()` points HOME and $T5LITE_DATA_DIR at fresh empty folders before anything is
imported, so every test's data dir is one the suite made (or a tmp dir of its own), and
subprocesses inherit them. `install()` adds an audit hook that records every file operation
Python makes under the user's real data dirs; conftest fails the test that made one.
`snapshot()` lists those dirs (names, sizes, mtimes) so the session can check that nothing,
subprocesses and C++ readers included, changed them. os.stat has no audit event, so a bare
existence check is not caught; every read of a file's content is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading

SANDBOX_ENV = "T5LITE_TEST_SANDBOX"  # the folder this session's HOME and data dir live in
GUARDED_ENV = "T5LITE_TEST_GUARDED"  # the user's real data dirs, os.pathsep-joined

# Events whose first argument (or, for rename / copy, first two) is a path.
_EVENTS = {"open": 1, "os.listdir": 1, "os.scandir": 1, "os.mkdir": 1, "os.remove": 1,
           "os.rmdir": 1, "os.rename": 2, "os.replace": 2, "os.truncate": 1, "os.chmod": 1,
           "os.utime": 1, "os.link": 2, "os.symlink": 2, "shutil.rmtree": 1,
           "shutil.copyfile": 2, "shutil.move": 2, "glob.glob": 1, "os.walk": 1}

_lock = threading.Lock()
_seen: list = []
_prefixes: tuple = ()
_expecting = threading.local()


def sandbox() -> bool:
    """Once per session (the first process; pytest-xdist workers inherit the environment):
    remember the user's real data dirs, then point HOME and $T5LITE_DATA_DIR at empty folders
    of a fresh temporary one. Returns whether this process made the sandbox (and so removes it
    with `remove()`)."""
    if os.environ.get(SANDBOX_ENV):
        return False
    real = [os.path.join(os.path.expanduser("~"), ".cache", "t5lite")]
    if os.environ.get("T5LITE_DATA_DIR"):
        real.append(os.path.abspath(os.path.expanduser(os.environ["T5LITE_DATA_DIR"])))
    root = tempfile.mkdtemp(prefix="t5lite-tests-")
    for sub in ("home", "data", "jax_cache"):
        os.makedirs(os.path.join(root, sub))
    os.environ[GUARDED_ENV] = os.pathsep.join(real)
    os.environ[SANDBOX_ENV] = root
    os.environ["HOME"] = os.path.join(root, "home")
    os.environ["T5LITE_DATA_DIR"] = os.path.join(root, "data")
    os.environ.pop("XDG_CACHE_HOME", None)  # caches follow HOME too
    # One compilation cache for the session's processes (workers and the CLI runs they start
    # inherit it): tests compile the same small programs many times. It starts empty, as on a
    # new machine: a cache that outlives the run makes every later suite on this machine
    # faster than a new machine's, and hides what the suite costs there.
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(root, "jax_cache")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    return True


def remove() -> None:
    shutil.rmtree(os.environ.get(SANDBOX_ENV, ""), ignore_errors=True)


def guarded() -> list[str]:
    return [p for p in os.environ.get(GUARDED_ENV, "").split(os.pathsep) if p]


def install() -> None:
    """Records file operations under the guarded dirs (their real paths too, for symlinks)."""
    global _prefixes
    dirs = {d for p in guarded() for d in (p, os.path.realpath(p))}
    _prefixes = tuple(dirs)
    if _prefixes:
        sys.addaudithook(_hook)


def _under(path) -> bool:
    try:
        p = os.path.abspath(os.fsdecode(os.fspath(path)))
    except (TypeError, ValueError):  # a file descriptor, None
        return False
    return any(p == d or p.startswith(d + os.sep) for d in _prefixes)


def _hook(event: str, args: tuple) -> None:
    n = _EVENTS.get(event)
    if n is None or getattr(_expecting, "on", False):
        return
    for path in args[:n]:
        if _under(path):
            with _lock:
                _seen.append(f"{event} {os.fsdecode(os.fspath(path))}")


@contextlib.contextmanager
def unrecorded():
    """Operations in this thread inside the block are not recorded (the guard's own walk)."""
    _expecting.on = True
    try:
        yield
    finally:
        _expecting.on = False


def take() -> list[str]:
    """The operations recorded since the last call (and forgets them)."""
    with _lock:
        out = list(_seen)
        _seen.clear()
    return out


def snapshot() -> dict:
    """{path: (size, mtime_ns)} of every file and folder under the guarded dirs."""
    state = {}
    with unrecorded():
        for top in guarded():
            _walk(top, state)
    return state


def _walk(top: str, state: dict) -> None:
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            state[path] = (st.st_size, st.st_mtime_ns)
    if os.path.lexists(top):
        state[top] = (0, os.lstat(top).st_mtime_ns)


def changes(before: dict, after: dict) -> list[str]:
    return sorted({p for p in before.keys() | after.keys() if before.get(p) != after.get(p)})
