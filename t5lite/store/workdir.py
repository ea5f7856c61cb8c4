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
import sys
import threading
import time
import uuid

from etils import epath

from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite.store import gcs

# ---------------------------------------------------------------------------- lock


DEFAULT_LEASE_SECONDS = config_lib.CheckpointConfig.lock_lease_seconds


class WorkdirLock:
    """WORKDIR/.lock for one `t5lite train` (multi-host: taken by process 0 only).

    Local paths use flock(2) on the lock file: the kernel releases it when the holder dies
    (even by SIGKILL), so a stale lock is taken over with no race and no guessing from pids.
    The file holds {"host", "pid", "started"} to name the holder in the refusal.

    gs:// has no locks: there the lock is a lease. The holder rewrites the record's
    "heartbeat" (epoch seconds) every lease / 6 from a daemon thread; a record whose heartbeat
    is older than its "lease_seconds" belongs to a dead run (a preempted slice: the workers of
    the recreated one have other host names) and is taken over; a fresh one is refused at
    once, and one that has missed beats (older than lease / 3) is waited on until it beats
    (refused) or expires. Every write is conditional on the record it read (GCS generation
    preconditions: create with ifGenerationMatch=0, beat / take over / delete with the
    generation seen), so of runs started together exactly one wins, and a holder whose record
    was replaced learns it at its next beat. A dead pid on this host is taken over at once.
    use_flock=False runs the lease on a local path (tests; shared filesystems without flock):
    there creating is atomic (link), a takeover or beat compares then renames.
    """

    def __init__(self, workdir: str, lease_seconds: float = DEFAULT_LEASE_SECONDS,
                 use_flock: bool | None = None):
        self.workdir = workdir
        self.path = os.path.join(workdir, ".lock")
        self.use_flock = "://" not in self.path if use_flock is None else use_flock
        self.lease = float(lease_seconds)
        self.fd = None
        self.took_over = None  # the stale holder's record, if any
        self.lost_to = None  # lease: the record of a run that took the lock from this one
        self.token = uuid.uuid4().hex
        self.generation = None  # lease: the generation of the record this run last wrote
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._stop = threading.Event()
        self._thread = None

    def acquire(self) -> "WorkdirLock":
        check_writable_dir(self.workdir)
        if self.use_flock:
            self._acquire_local()
        else:
            self._acquire_lease()
        return self

    def _record(self) -> str:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "started": self.started, "heartbeat": round(time.time(), 3),
                           "lease_seconds": self.lease, "token": self.token})

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

    # ------------------------------------------------------------------ lease (gs://)
    def _age(self, old, mtime=None) -> tuple[float, float]:
        """-> (seconds since the holder's last heartbeat, its lease). A record without one
        (torn, or from an older t5lite) is dated by the object's modification time."""
        beat = (old or {}).get("heartbeat")
        if not isinstance(beat, (int, float)) or isinstance(beat, bool):
            beat = time.time() if mtime is None else mtime
        lease = (old or {}).get("lease_seconds")
        if not isinstance(lease, (int, float)) or isinstance(lease, bool) or lease <= 0:
            lease = self.lease
        return time.time() - beat, float(lease)

    def _acquire_lease(self) -> None:
        store, announced = _LeaseRecord(self.path), False
        while True:
            self.generation = store.write_if(self._record(), 0)  # create if absent
            if self.generation is not None:
                break
            data, generation, mtime = store.read()
            if generation is None:
                continue  # released between our create and read: create again
            old = _parse(data) or {}
            age, lease = self._age(old, mtime)
            if age > lease or (old.get("host") == socket.gethostname()
                               and not _pid_alive(old.get("pid"))):
                self.generation = store.write_if(self._record(), generation)
                if self.generation is not None:
                    self.took_over = dict(old, heartbeat_age=round(age, 1))
                    break
                continue  # another run took it over first: judge its record
            # a live holder beats every lease / 6, so a record this fresh is one: refuse now
            if age <= lease / 3:
                raise UserError(self._refusal(old, age=age, lease=lease))
            # missed beats: most likely a run that is gone (a preempted slice recreated
            # faster than the lease): wait for a beat (-> refuse) or for the lease to run out
            if not announced:
                print(f"t5lite: {self.workdir}'s lock has had no heartbeat for {age:.0f}s (pid "
                      f"{old.get('pid')} on host {old.get('host')}): waiting up to "
                      f"{lease - age:.0f}s for it to expire", flush=True)
                announced = True
            time.sleep(min(lease - age, lease / 6) + 0.05)
        self._thread = threading.Thread(target=self._heartbeat, args=(store,),
                                        name="t5lite-lock-heartbeat", daemon=True)
        self._thread.start()

    def _heartbeat(self, store) -> None:
        while not self._stop.wait(self.lease / 6):
            try:
                generation = store.write_if(self._record(), self.generation)
                if generation is not None:
                    self.generation = generation
                    continue
                # this run went silent for longer than its lease and another took over
                self.lost_to = _parse(store.read()[0]) or {}
                print(f"t5lite: warning: {self.workdir} was taken over by pid "
                      f"{self.lost_to.get('pid')} on host {self.lost_to.get('host')} (this "
                      "run's heartbeat lapsed); stop this run: two runs on one workdir damage "
                      "it", file=sys.stderr, flush=True)
                return
            except Exception:  # noqa: BLE001 - a failed beat is retried at the next one
                continue

    def _refusal(self, holder, age=None, lease=None) -> str:
        holder = holder or {}
        who = (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started "
               f"{holder.get('started', '?')}"
               + (f", last heartbeat {age:.0f}s ago" if age is not None else ""))
        return (f"workdir {self.workdir} is in use by another t5lite train ({who}); wait for "
                "it to finish or stop it, or use another --workdir"
                + (f" (if that run is dead, its lock expires {lease:.0f}s after its last "
                   "heartbeat: rerun then)" if lease is not None else ""))

    def takeover_line(self) -> str:
        """One line naming the stale holder this lock was taken from ('' if none)."""
        old = self.took_over
        if not old:
            return ""
        why = (f"no heartbeat for {old['heartbeat_age']:.0f}s"
               if "heartbeat_age" in old else "its process is gone")
        return (f"took over the lock of a run that is gone (pid {old.get('pid')} on "
                f"{old.get('host')}, started {old.get('started')}; {why})")

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)  # while still holding it: see the inode check above
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None
        elif self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30)
            self._thread = None
            try:  # only the record this run wrote: never a run that took over since
                _LeaseRecord(self.path).delete_if(self.generation)
            except OSError:
                pass

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


class _LeaseRecord:
    """The lease's record with compare-and-swap writes: on gs:// the object's generation
    (preconditions, atomic on the server); on a local path the file's inode and mtime
    (create through link(2) is atomic, replace is compare-then-rename)."""

    def __init__(self, path: str):
        self.path = path
        self.remote = gcs.is_gcs(path)

    def read(self):
        """-> (bytes, generation, modification epoch seconds), or Nones when absent."""
        if self.remote:
            return gcs.read(self.path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None, None, None
        try:
            st = os.fstat(fd)
            data = b""
            while chunk := os.read(fd, 1 << 16):
                data += chunk
        finally:
            os.close(fd)
        return data, f"{st.st_ino}-{st.st_mtime_ns}", st.st_mtime

    def write_if(self, text: str, generation):
        """Write when the record's generation is `generation` (0: absent). -> the new
        generation, or None when another writer changed it first."""
        if self.remote:
            return gcs.write_if(self.path, text.encode(), generation)
        tmp = f"{self.path}.{uuid.uuid4().hex[:8]}.tmp"  # one per writer
        try:
            with open(tmp, "w") as f:
                f.write(text)
            if generation == 0:
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    return None
            else:
                if self.read()[1] != generation:
                    return None
                os.replace(tmp, self.path)
            return self.read()[1]
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def delete_if(self, generation) -> bool:
        if generation is None:
            return False
        if self.remote:
            return gcs.delete_if(self.path, generation)
        if self.read()[1] != generation:
            return False
        os.unlink(self.path)
        return True


def _parse(data):
    try:
        value = json.loads(data)
        return value if isinstance(value, dict) else None
    except (TypeError, ValueError):
        return None


def _read_json(path: str):
    try:
        return _parse(epath.Path(path).read_text())
    except OSError:
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


def refuse_a_file(workdir: str) -> None:
    """A local --workdir that is an existing file: one line, before anything is read or made
    (so the user hears of their argument first, not of data or imports it never reached)."""
    if "://" not in workdir and os.path.exists(workdir) and not os.path.isdir(workdir):
        raise UserError(f"--workdir {workdir} is a file, not a directory; give a directory "
                        "(it is created if missing)")


def check_writable_dir(workdir: str) -> None:
    """The workdir exists (or is created) as a writable directory; else one line saying why."""
    if "://" in workdir:
        epath.Path(workdir).mkdir(parents=True, exist_ok=True)
        return
    refuse_a_file(workdir)
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
                  "checkpoint.init_step", "checkpoint.lock_lease_seconds", "train.peak_flops",
                  "train.prepare_data", "data.data_dir", "data.task_modules",
                  "data.task_module_files", "model.remat",
                  "model.scan_unroll", "train.profile_steps", "train.wandb_project",
                  "train.wandb_entity", "train.wandb_mode")
# Keys that change when or how much is trained / logged / evaluated, or how the optimizer
# steps and the loss weighs, but not the shape of any saved array: allowed with
# --allow-config-change and recorded in WORKDIR/config_history.jsonl. They are what recovering
# a diverged run changes (resume the last good checkpoint with a lower learning rate, clipping,
# and train.skip_batches past the spike). train.steps is also the end of the learning-rate
# decay (cosine / linear), with optim.min_lr_ratio its floor. train.grad_accum_steps splits the
# same global batch into micro-batches (the same update: fewer activations, for a smaller slice).
SAFE_KEYS = ("train.steps", "optim.min_lr_ratio", "train.log_every", "train.eval_every",
             "train.eval_steps", "train.stop_on_nan", "eval.", "decode.",
             "checkpoint.every_steps", "checkpoint.keep", "optim.learning_rate",
             "optim.schedule", "optim.warmup_steps", "optim.ramp_steps", "optim.b1",
             "optim.b2", "optim.eps", "optim.weight_decay", "optim.clip_grad_norm", "train.z_loss",
             "train.label_smoothing", "model.dropout_rate", "train.skip_batches",
             "train.grad_accum_steps")
HISTORY = "config_history.jsonl"


def _layout_switches(diff: dict, new_flat: dict) -> dict:
    """The safe-key changes that still add or remove a transform of the optimizer (so the saved
    optimizer state has another tree): gradient clipping switched on or off, and Adafactor's
    weight decay switched on or off (AdamW keeps its decay transform at 0)."""
    out = {}
    for key in ("optim.clip_grad_norm", "optim.weight_decay"):
        if key not in diff:
            continue
        before, after = diff[key]
        if key == "optim.weight_decay" and new_flat.get("optim.name") != "adafactor":
            continue
        if ((before or 0) > 0) != ((after or 0) > 0):
            out[key] = diff[key]
    return out


def _matches(key: str, patterns) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in patterns)


def config_diff(old: dict, new: dict) -> dict:
    """{key: (old, new)} over the flattened configs, placement keys left out. A key missing
    from the old config (a field added since) counts as its default, or as the value configs
    saved before it had (config.LEGACY_VALUES)."""
    default = json.loads(json.dumps(config_lib.to_dict(config_lib.Config())))
    flat_old, flat_new = config_lib.flatten(old), config_lib.flatten(new)
    flat_def = dict(config_lib.flatten(default), **config_lib.LEGACY_VALUES)
    out = {}
    for key in sorted(flat_new):
        if _matches(key, PLACEMENT_KEYS):
            continue
        before = flat_old.get(key, flat_def.get(key))
        if before != flat_new[key]:
            out[key] = (before, flat_new[key])
    return out


def recovery_hint(cfg, last_step) -> str:
    """What to do after a non-finite step, for the UserError that stops the run: resume from
    the last good checkpoint in the same workdir with the changes SAFE_KEYS lets through."""
    lr = cfg.optim.learning_rate
    if not last_step:
        return (f"Lower optim.learning_rate (now {lr:g}), set optim.clip_grad_norm, or check "
                "the data.")
    clip = (", a lower optim.clip_grad_norm" if cfg.optim.clip_grad_norm > 0 else
            " (switching optim.clip_grad_norm on needs a new --workdir with --set "
            "checkpoint.init_from=... checkpoint.init_state=true)")
    return (f"To resume from it, rerun with --allow-config-change and a lower learning rate "
            f"(--set optim.learning_rate={lr / 2:g}, now {lr:g}){clip}; after a loss spike "
            f"also --set train.skip_batches={last_step}:N to skip the N batches that follow "
            "it. Or check the data.")


def format_diff(diff: dict, limit: int = 6) -> str:
    """'key old -> new, ...' of a config_diff (the first `limit`)."""
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
    switches = _layout_switches(diff, config_lib.flatten(new))
    unsafe.update(switches)
    if unsafe:
        raise UserError(
            f"{workdir} was trained with another config: {format_diff(unsafe)}. Its checkpoints "
            "cannot continue under these changes"
            + (f" (switching {' or '.join(switches)} on or off adds or removes an optimizer "
               "transform, so the optimizer state has another layout)" if switches else "")
            + ": use a new --workdir (add --set "
            f"checkpoint.init_from={workdir} to start from its params"
            + (", and checkpoint.init_state=true to continue its step count" if switches
               else "") + "), or rerun with the workdir's config.json"
            + (f" (the other changes, {', '.join(k for k in diff if k not in unsafe)}, are "
               "allowed with --allow-config-change)" if len(unsafe) < len(diff) else ""))
    if diff and not allow_change:
        raise UserError(
            f"{workdir} was trained with another config: {format_diff(diff)}. To continue with "
            "these changes rerun with --allow-config-change (the old config is kept as "
            "config.<n>.json), or use a new --workdir")
    return old != new


def write_config(cfg, workdir: str, step: int | None = None) -> None:
    """config.json <- cfg, atomically; an existing, different one is kept as config.<n>.json
    (n = 1, 2, ...: the order the configs were replaced in) and the change is appended to
    config_history.jsonl: the step the new config applies from (the restored checkpoint's),
    the kept file, and each changed key's old and new value."""
    from t5lite.store.paths import write_atomic
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
        _record_change(workdir, step, f"config.{n}.json", old, text)
    write_atomic(path, text)


def _record_change(workdir: str, step, kept: str, old_text: str, new_text: str) -> None:
    """One line of config_history.jsonl (appended: the history only grows) and one printed."""
    try:
        changes = config_diff(json.loads(old_text), json.loads(new_text))
    except ValueError:  # an unreadable old config (kept as is): no keys to compare
        changes = {}
    row = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "step": step,
           "kept_as": kept, "changes": {k: list(v) for k, v in changes.items()}}
    line, path = json.dumps(row) + "\n", os.path.join(workdir, HISTORY)
    if gcs.is_gcs(path):
        gcs.append(path, line.encode())
    else:
        with open(path, "a") as f:
            f.write(line)
    if changes:
        print(f"t5lite: config changed{'' if step is None else f' from step {step}'}: "
              f"{format_diff(changes)} (the old one is {kept}; history in {path})", flush=True)
