"""A training workdir's guards: one run at a time (WORKDIR/.lock) and one config per run
(config.json, checked before anything is written).

Both run before the first byte of a run is written, so a mistaken second run (same workdir,
or a changed config) stops with one line and leaves every checkpoint, metrics line and config
of the first one as it was.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time

from etils import epath

from t5lite import config as config_lib
from t5lite.errors import UserError

# ---------------------------------------------------------------------------- lock


class WorkdirLock:
    """WORKDIR/.lock for one `t5lite train` (multi-host: taken by process 0 only).

    Local paths use flock(2) on the lock file: the kernel releases it when the holder dies
    (even by SIGKILL), so a stale lock is taken over with no race and no guessing from pids.
    The file holds {"host", "pid", "started"} to name the holder in the refusal. gs:// has no
    locks: there the file is checked, then written (a window of one round trip), and a lock
    left by a dead run must be deleted by hand (the refusal says so); on the same host a dead
    pid is recognised and taken over.
    """

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = os.path.join(workdir, ".lock")
        self.fd = None
        self.took_over = None  # the stale holder's record, if any

    def acquire(self) -> "WorkdirLock":
        check_writable_dir(self.workdir)
        if "://" in self.path:
            self._acquire_url()
        else:
            self._acquire_local()
        return self

    def _record(self) -> str:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    def _acquire_local(self) -> None:
        import fcntl
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                    raise UserError(self._refusal(_read_json(self.path))) from None
                raise
            # the holder may have unlinked the file between our open and flock: retry on the
            # new one, or two runs would each hold a lock on a different inode
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        old = _read_json(self.path)
        if old:
            self.took_over = old
        os.ftruncate(fd, 0)
        os.pwrite(fd, self._record().encode(), 0)
        os.fsync(fd)
        self.fd = fd

    def _acquire_url(self) -> None:
        path = epath.Path(self.path)
        if path.exists():
            old = _read_json(self.path) or {}
            if not (old.get("host") == socket.gethostname() and not _pid_alive(old.get("pid"))):
                raise UserError(self._refusal(old, url=True))
            self.took_over = old
        path.write_text(self._record())

    def _refusal(self, holder, url=False) -> str:
        holder = holder or {}
        who = (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started "
               f"{holder.get('started', '?')}")
        return (f"workdir {self.workdir} is in use by another t5lite train ({who}); wait for "
                "it to finish or stop it, or use another --workdir"
                + (f" (if that run is dead, delete {self.path})" if url else ""))

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)  # while still holding it: see the inode check above
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None
        elif "://" in self.path:
            try:
                if (_read_json(self.path) or {}).get("pid") == os.getpid():
                    epath.Path(self.path).unlink(missing_ok=True)
            except OSError:
                pass

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _read_json(path: str):
    try:
        data = json.loads(epath.Path(path).read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_writable_dir(workdir: str) -> None:
    """The workdir exists (or is created) as a writable directory; else one line saying why."""
    if "://" in workdir:
        epath.Path(workdir).mkdir(parents=True, exist_ok=True)
        return
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise UserError(f"--workdir {workdir} is a file, not a directory; give a directory "
                        "(it is created if missing)")
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --workdir {workdir}: {e.strerror}; choose a writable "
                        "location") from None
    if not os.access(workdir, os.W_OK | os.X_OK):
        raise UserError(f"--workdir {workdir} is not writable (read-only or permission "
                        "denied); fix its permissions or choose another location")


# ---------------------------------------------------------------------------- config guard

# Keys that say where / how fast a run executes, not what it computes: they may differ freely
# between the runs of one workdir (resuming on another slice is the point of mesh changes).
PLACEMENT_KEYS = ("name", "mesh.", "checkpoint.async_save", "checkpoint.init_from",
                  "checkpoint.init_step", "train.peak_flops", "train.prepare_data",
                  "data.data_dir", "data.task_modules", "model.remat", "model.scan_unroll",
                  "train.profile_steps")
# Keys that change when or how much is trained / logged / evaluated, but not the meaning of
# the saved state: allowed with --allow-config-change. train.steps is also the end of the
# learning-rate decay (cosine / linear), with optim.min_lr_ratio its floor.
SAFE_KEYS = ("train.steps", "optim.min_lr_ratio", "train.log_every", "train.eval_every",
             "train.eval_steps", "train.stop_on_nan", "eval.", "decode.",
             "checkpoint.every_steps", "checkpoint.keep")


def _matches(key: str, patterns) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in patterns)


def config_diff(old: dict, new: dict) -> dict:
    """{key: (old, new)} over the flattened configs, placement keys left out. A key missing
    from the old config (a field added since) counts as its default."""
    default = json.loads(json.dumps(config_lib.to_dict(config_lib.Config())))
    flat_old, flat_new = config_lib._flatten(old), config_lib._flatten(new)
    flat_def = config_lib._flatten(default)
    out = {}
    for key in sorted(flat_new):
        if _matches(key, PLACEMENT_KEYS):
            continue
        before = flat_old.get(key, flat_def.get(key))
        if before != flat_new[key]:
            out[key] = (before, flat_new[key])
    return out


def _show(diff: dict, limit: int = 6) -> str:
    items = [f"{k} {v[0]!r} -> {v[1]!r}" for k, v in diff.items()]
    return ", ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit
                                       else "")


def check_config(cfg, workdir: str, allow_change: bool = False) -> bool:
    """Compare cfg with WORKDIR/config.json (if any). -> True when config.json must be
    (re)written. Raises UserError naming the differing keys and what to do."""
    path = epath.Path(workdir) / "config.json"
    new = json.loads(json.dumps(config_lib.to_dict(cfg)))
    if not path.exists():
        return True
    try:
        old = json.loads(path.read_text())
        if not isinstance(old, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is unreadable ({e}); restore it (config.<n>.json are earlier "
                        "ones) or use another --workdir") from None
    diff = config_diff(old, new)
    unsafe = {k: v for k, v in diff.items() if not _matches(k, SAFE_KEYS)}
    if unsafe:
        raise UserError(
            f"{workdir} was trained with another config: {_show(unsafe)}. Its checkpoints "
            "cannot continue under these changes: use a new --workdir (add --set "
            f"checkpoint.init_from={workdir} to start from its params), or rerun with the "
            "workdir's config.json"
            + (f" (the other changes, {', '.join(k for k in diff if k not in unsafe)}, are "
               "allowed with --allow-config-change)" if len(unsafe) < len(diff) else ""))
    if diff and not allow_change:
        raise UserError(
            f"{workdir} was trained with another config: {_show(diff)}. To continue with "
            "these changes rerun with --allow-config-change (the old config is kept as "
            "config.<n>.json), or use a new --workdir")
    return old != new


def write_config(cfg, workdir: str) -> None:
    """config.json <- cfg, atomically; an existing, different one is kept as config.<n>.json
    (n = 1, 2, ...: the order the configs were replaced in)."""
    from t5lite.checkpointing import write_atomic
    root = epath.Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.json"
    text = json.dumps(config_lib.to_dict(cfg), indent=2)
    if path.exists():
        old = path.read_text()
        if old == text:
            return
        n = 1
        while (root / f"config.{n}.json").exists():
            n += 1
        write_atomic(root / f"config.{n}.json", old)
    write_atomic(path, text)
