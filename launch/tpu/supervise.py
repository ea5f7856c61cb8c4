"""`supervise`: create (or wait for) the slice, set it up and run the same `train` command,
again and again after preemptions and lost slices, until the run reaches its last step.

Every cloud step (create, setup with its copy, ssh) is retried with bounded, jittered
exponential backoff; a permanent error (bad flag, quota, permission) stops after a few tries
with gcloud's message. A stop (`stop-job`, `stop-vm`, `delete`, or the slice deleted from
elsewhere) ends supervise: a stopped run is never restarted or recreated.
"""

from __future__ import annotations

import time

from .fit_check import fit_check
from .gcloud import Cloud, Node, check_ssh_agent, last_lines, qr_state
from .job import EXIT_PREEMPTED, Outcome, run_job, train_command_line
from .layout import WORKER_LOGS
from .messages import CloudError, LaunchError, note, verb_line
from .preflight import check_bucket
from .retry import Backoff, failure_kind, tries_for
from .slices import parse_accelerator_type
from .stopmark import Stopped, clear_stop, stop_requested
from .vm import create, delete_resource, node_lost, require_node, use_queued, wait_active
from .worker_setup import setup, setup_done

WAITING = ("ACCEPTED", "CREATING", "PROVISIONING", "WAITING_FOR_RESOURCES")


def slice_lost(cloud: Cloud, args, queued: bool) -> str:
    """Why the slice can't run the job any more ('' when it is READY / ACTIVE)."""
    if queued:
        try:
            qr = cloud.queued_resource()
        except CloudError:
            return ""  # gcloud could not say; the next poll asks again
        if qr is None:
            return "the queued resource is gone"
        state, reason = qr_state(qr)
        if state != "ACTIVE":
            return f"the queued resource is {state}" + (f" ({reason})" if reason else "")
    return node_lost(cloud)


def deleted(why: str) -> bool:
    """Preemption leaves the slice (PREEMPTED / SUSPENDED); only a delete removes it."""
    return "is gone" in why or "DELETING" in why


def ensure_slice(cloud: Cloud, args, queued: bool, first: bool) -> bool:
    """Make the slice exist and be READY; True when it was (re)created (so needs setup). A
    slice deleted while supervise ran (not on its first round) is a stop, not a loss."""
    if cloud.dry:
        create(cloud, args)
        return True
    why = slice_lost(cloud, args, queued)
    if not why:
        return False
    if deleted(why) and not first:
        raise Stopped(f"{why}: deleted, not preempted")
    qr = cloud.queued_resource() if queued else None
    state = qr_state(qr)[0] if qr else "NOT_FOUND"
    if queued and state in WAITING:
        wait_active(cloud, args, stoppable=True)
        return True
    while queued and state == "DELETING":  # a delete from before this supervise
        time.sleep(args.poll_seconds)
        qr = cloud.queued_resource()
        state = qr_state(qr)[0] if qr else "NOT_FOUND"
    node = None if queued else cloud.node()
    if node is not None and node.state in ("CREATING", "STARTING", "RESTARTING"):
        if wait_node_ready(cloud, args):
            return True
        node = cloud.node()
    if qr is not None or node is not None:
        note(f"supervise: {why}: deleting it to create it again")
        delete_resource(cloud, args, "queued" if queued else "tpu-vm")
    create(cloud, args, stoppable=True)
    return True


def wait_node_ready(cloud: Cloud, args) -> bool:
    while True:
        node = cloud.node()
        if node is None or node.state not in ("CREATING", "STARTING", "RESTARTING"):
            return node is not None and node.state == "READY"
        time.sleep(args.poll_seconds)


def prepare(cloud: Cloud, args, queued: bool, first: bool) -> Node:
    """The slice READY and set up; a CloudError names the step that failed."""
    fresh = ensure_slice(cloud, args, queued, first)
    try:
        node = require_node(cloud, args)
    except LaunchError as e:  # not READY (preempted again, still starting): try again
        raise CloudError(f"the slice: {e}") from None
    check_ssh_agent(node.workers)
    try:
        if fresh or not setup_done(cloud, node):
            setup(cloud, args, node)
    except CloudError as e:
        raise CloudError(f"setup: {e}") from None
    return node


def retrying(what, step, args, backoff: Backoff):
    """step() until it succeeds; each failure logged on one line, then a jittered wait."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return step()
        except CloudError as e:
            error = str(e)
        kind = failure_kind(error)
        tries = tries_for(kind, args.retries)
        if attempt >= tries:
            raise CloudError(f"{what} failed {attempt} time(s), giving up ({kind}): {error}")
        delay = backoff.delay(attempt)
        note(f"supervise: {what} failed ({kind}: {last_lines(error, 1)}); "
             f"try {attempt + 1}/{tries} in {delay:.0f}s")
        pause(args, delay)


def pause(args, seconds: float) -> None:
    """Sleep, checking for a stop every second (a stop must not wait out a long backoff)."""
    end = time.monotonic() + seconds
    while True:
        stop = stop_requested(args)
        if stop:
            raise Stopped(stop)
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 1.0))


def restart_reason(out: Outcome, lost: str) -> str:
    return lost or {"preempted": f"preempted (exit {EXIT_PREEMPTED}, checkpoint saved)",
                    "disconnected": f"lost the connection ({out.detail})"}.get(
                        out.kind, out.detail)


def supervise(cloud: Cloud, args) -> int:
    """Run until the last step (exit 0 on every worker), a real failure, or a stop."""
    if not args.accelerator_type:
        raise LaunchError("supervise needs --accelerator-type (it creates the slice when needed).")
    train_command_line(args)
    st = parse_accelerator_type(args.accelerator_type)
    queued = use_queued(args, st)
    fit_check(args, st.accelerator_type)  # before renting anything
    check_bucket(cloud, args)
    if cloud.dry:
        ensure_slice(cloud, args, queued, first=True)
        setup(cloud, args, Node("READY", st.accelerator_type, st.hosts))
        run_job(cloud, args, Node("READY", st.accelerator_type, st.hosts), detach=False)
        return 0
    earlier = clear_stop(args)
    if earlier:
        note(f"supervise: an earlier stop ({earlier}) is cleared: this supervise runs")
    try:
        return supervise_loop(cloud, args, queued)
    except Stopped as e:
        note(f"supervise: stopped ({e}): not restarting the job or recreating the slice.")
        return 0


def supervise_loop(cloud: Cloud, args, queued: bool) -> int:
    backoff, first = Backoff(args.backoff, args.max_backoff), True
    restarts = streak = 0  # all restarts; those since the job last ran an hour (the backoff)
    while True:
        started = time.monotonic()
        node = retrying("getting the slice ready", lambda: prepare(cloud, args, queued, first),
                        args, backoff)
        first = False
        try:
            out = run_job(cloud, args, node, detach=False,
                          watch=lambda: slice_lost(cloud, args, queued) or (
                              "stop asked" if stop_requested(args) else ""))
        except CloudError as e:  # the --env copy failed: a restart retries it
            out = Outcome("disconnected", 1, str(e))
        stop = stop_requested(args)
        if out.kind == "stopped" or stop:
            raise Stopped(out.detail if out.kind == "stopped" else stop)
        if out.kind == "done":
            note(f"supervise: the run reached its last step (exit 0 on all {node.workers} "
                 f"worker(s)) after {restarts} restart(s). {args.name} is still running and "
                 f"billing: {verb_line(args, 'delete')} stops that.")
            return 0
        lost = slice_lost(cloud, args, queued)
        if deleted(lost):
            raise Stopped(f"{lost}: deleted, not preempted")
        if out.kind in ("failed", "refused") and not lost:
            note(f"supervise: {out.detail}: a real failure, not restarting. Logs above and in "
                 f"{args.workdir.rstrip('/')}/{WORKER_LOGS}/. {args.name} is still running and "
                 f"billing: {verb_line(args, 'delete')} stops that.")
            return out.rc
        streak = 1 if time.monotonic() - started > 3600 else streak + 1  # progress: anew
        restarts += 1
        reason = restart_reason(out, lost)
        if restarts > args.max_restarts:
            note(f"supervise: {reason}; giving up after {args.max_restarts} restarts "
                 "(--max-restarts). Run supervise again to go on from the last checkpoint.")
            return out.rc or 1
        delay = backoff.delay(streak)
        note(f"supervise: {reason}; restart {restarts}/{args.max_restarts} in {delay:.0f}s")
        pause(args, delay)
