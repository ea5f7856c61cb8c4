"""What keeps a run safe to rerun: the workdir lock, SIGTERM -> a save at the next step
boundary, and a full disk -> a message that says the last checkpoint is intact."""

from __future__ import annotations

import os

import jax

from t5lite.errors import UserError
from t5lite.store import checkpointing
from t5lite.store import workdir as workdir_lib


def lock_workdir(workdir: str, lease_seconds: float):
    """WORKDIR/.lock, taken by process 0; every process stops if it could not be taken."""
    lock, error = None, None
    if jax.process_index() == 0:
        try:
            lock = workdir_lib.WorkdirLock(workdir, lease_seconds).acquire()
        except UserError as e:
            error = e
    if not checkpointing.all_hosts_ok(error is None):
        raise error or UserError(f"process 0 could not lock {workdir} (see its message)")
    if lock is not None and lock.took_over:
        print(f"t5lite: {lock.takeover_line()}", flush=True)
    return lock


class Preemption:
    """SIGTERM (a spot / queued slice being reclaimed) -> save at the next step boundary.

    One process: a Python SIGTERM handler sets a flag. Several processes: JAX's preemption
    service (on by default with jax.distributed) already catches SIGTERM on any host and
    agrees on one step for all (reached_preemption_sync_point); a Python handler would replace
    its C++ one, so none is installed there.
    """

    def __init__(self):
        import signal
        import threading
        self.signalled = False
        self._old = None
        self.multihost = jax.process_count() > 1
        if not self.multihost and threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame):
        self.signalled = True

    def reached(self, step: int) -> bool:
        if not self.multihost:
            return self.signalled
        from jax.experimental import multihost_utils
        try:
            return multihost_utils.reached_preemption_sync_point(step)
        except RuntimeError:  # jax_enable_preemption_service off: SIGTERM just ends the run
            return False

    def close(self):
        if self._old is not None:
            import signal
            signal.signal(signal.SIGTERM, self._old)
            self._old = None


def no_space(err: BaseException) -> bool:
    """True when a full disk is somewhere in err's chain (OSError ENOSPC, or orbax / TF
    errors that only carry its message)."""
    import errno
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def no_space_message(workdir: str) -> str:
    try:
        import orbax.checkpoint as ocp
        steps = ocp.utils.checkpoint_steps(os.path.join(workdir, "checkpoints"))
        last = max(steps) if steps else None
    except Exception:  # noqa: BLE001 - the message matters more than the step number
        last = "?"
    return (f"no space left on device writing to {workdir}; "
            + (f"the last checkpoint (step {last}) is intact. " if last is not None else
               "no checkpoint was written yet. ")
            + "Free space there and rerun the same command to resume (the half-written save "
            "is cleaned up at start)")
