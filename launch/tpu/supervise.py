"""`supervise`: create (or wait for) the slice, set it up and run the same `train` command,
again and again after preemptions and lost slices, until the run reaches its last step."""

from __future__ import annotations

import time

from .fit_check import fit_check
from .gcloud import Cloud, Node, check_ssh_agent, qr_state
from .job import EXIT_PREEMPTED, run_job, train_command_line
from .layout import WORKER_LOGS
from .messages import LaunchError, note, verb_line
from .slices import parse_accelerator_type
from .vm import create, delete_resource, require_node, wait_active
from .worker_setup import setup, setup_done

def slice_lost(cloud: Cloud, args, queued: bool) -> str:
    """Why the slice can't run the job any more ('' when it is READY / ACTIVE)."""
    if queued:
        qr = cloud.queued_resource()
        if qr is None:
            return "the queued resource is gone"
        state, reason = qr_state(qr)
        if state != "ACTIVE":
            return f"the queued resource is {state}" + (f" ({reason})" if reason else "")
    node = cloud.node()
    if node is None:
        return "the TPU VM is gone"
    return "" if node.state == "READY" else f"the TPU VM is {node.state}"


def ensure_slice(cloud: Cloud, args, queued: bool) -> bool:
    """Make the slice exist and be READY; True when it was (re)created (so needs setup)."""
    if cloud.dry:
        create(cloud, args)
        return True
    why = slice_lost(cloud, args, queued)
    if not why:
        return False
    if queued:
        qr = cloud.queued_resource()
        state = qr_state(qr)[0] if qr else "NOT_FOUND"
        if state in ("ACCEPTED", "CREATING", "PROVISIONING", "WAITING_FOR_RESOURCES"):
            wait_active(cloud, args)
            return True
        while state == "DELETING":  # someone deleted it: wait until it is gone
            time.sleep(args.poll_seconds)
            qr = cloud.queued_resource()
            state = qr_state(qr)[0] if qr else "NOT_FOUND"
        if qr is not None:
            note(f"supervise: {why}: deleting it to create it again")
            delete_resource(cloud, args, "queued")
    else:
        node = cloud.node()
        if node is not None and node.state == "CREATING":
            return not wait_node_ready(cloud, args)
        if node is not None:
            note(f"supervise: {why}: deleting it to create it again")
            delete_resource(cloud, args, "tpu-vm")
    create(cloud, args)
    return True


def wait_node_ready(cloud: Cloud, args) -> bool:
    while True:
        node = cloud.node()
        if node is None or node.state not in ("CREATING", "STARTING", "RESTARTING"):
            return node is not None and node.state == "READY"
        time.sleep(args.poll_seconds)


def supervise(cloud: Cloud, args) -> int:
    """(Re)create / wait for the slice, (re)run setup and the same train command until the run
    reaches its last step (exit 0 everywhere). Reruns after exit 75 (preempted, checkpoint
    saved) and after a lost worker or slice; stops on any other exit code."""
    if not args.accelerator_type:
        raise LaunchError("supervise needs --accelerator-type (it creates the slice when needed).")
    train_command_line(args)
    st = parse_accelerator_type(args.accelerator_type)
    queued = st.hosts > 1 if args.queued is None else args.queued
    fit_check(args, st.accelerator_type)  # before renting anything
    if cloud.dry:
        ensure_slice(cloud, args, queued)
        setup(cloud, args, Node("READY", st.accelerator_type, st.hosts))
        run_job(cloud, args, Node("READY", st.accelerator_type, st.hosts), detach=False)
        return 0
    restarts, delay = 0, args.backoff
    while True:
        started = time.monotonic()
        fresh = ensure_slice(cloud, args, queued)
        node = require_node(cloud, args)
        check_ssh_agent(node.workers)
        if fresh or not setup_done(cloud, node):
            setup(cloud, args, node)
        out = run_job(cloud, args, node, detach=False)
        if out.kind == "done":
            note(f"supervise: the run reached its last step (exit 0 on all {node.workers} "
                 f"worker(s)) after {restarts} restart(s). {args.name} is still running and "
                 f"billing: {verb_line(args, 'delete')} stops that.")
            return 0
        lost = slice_lost(cloud, args, queued)
        if out.kind in ("failed", "refused") and not lost:
            note(f"supervise: {out.detail}: a real failure, not restarting. Logs above and in "
                 f"{args.workdir.rstrip('/')}/{WORKER_LOGS}/. {args.name} is still running and "
                 f"billing: {verb_line(args, 'delete')} stops that.")
            return out.rc
        reason = (lost or {"preempted": f"preempted (exit {EXIT_PREEMPTED}, checkpoint saved)",
                           "disconnected": f"lost the connection ({out.detail})"}.get(
                               out.kind, out.detail))
        if time.monotonic() - started > 3600:  # it made progress: back off from scratch
            delay = args.backoff
        restarts += 1
        if restarts > args.max_restarts:
            note(f"supervise: {reason}; giving up after {args.max_restarts} restarts "
                 "(--max-restarts). Run supervise again to go on from the last checkpoint.")
            return out.rc or 1
        note(f"supervise: {reason}; restart {restarts}/{args.max_restarts} in {delay:.0f}s")
        time.sleep(delay)
        delay = min(max(delay * 2, 1.0), args.max_backoff)
