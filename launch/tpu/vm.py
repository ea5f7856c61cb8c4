"""The TPU VM or queued resource itself: find out which it is, create it and wait until it is
usable, stop, start, delete and describe it."""

from __future__ import annotations

import time

from .gcloud import Cloud, Node, check_ssh_agent, last_lines, qr_state
from .layout import JOB, REMOTE_DIR
from .messages import CloudError, LaunchError, note, verb_line, where_text
from .slices import SliceType, parse_accelerator_type
from .stopmark import Stopped, mark_stopped, stop_requested

ALPHA_HINT = ("--best-effort runs `gcloud alpha`, which needs gcloud's alpha component: "
              "`gcloud components install alpha` (or the google-cloud-cli-alpha package).")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def resolve_kind(cloud: Cloud, args) -> str:
    """'queued' or 'tpu-vm': from --queued/--no-queued, else asked of gcloud."""
    if args.queued is not None:
        return "queued" if args.queued else "tpu-vm"
    if cloud.dry:
        note("(dry run) assuming a plain TPU VM; a real run asks gcloud whether "
             f"{args.name} is a queued resource (--queued / --no-queued to say so)")
        return "tpu-vm"
    if cloud.queued_resource() is not None:
        return "queued"
    if cloud.node() is not None:
        return "tpu-vm"
    raise LaunchError(f"there is no TPU VM or queued resource named {args.name} "
                      f"{where_text(args)}".rstrip()
                      + "; check --zone / --project, or `create` it.")


def require_node(cloud: Cloud, args) -> Node:
    """The TPU VM(s), READY; in a dry run what --accelerator-type says."""
    if cloud.dry:
        acc = args.accelerator_type
        return Node("READY", acc, parse_accelerator_type(acc).hosts if acc else 1)
    node = cloud.node()
    if node is None:
        raise LaunchError(f"there is no TPU VM named {args.name} {where_text(args)}; "
                          "check --zone / --project, or `create` it (a queued resource still "
                          "waiting for capacity has no VM yet: see `status`).")
    if node.state != "READY":
        fix = {"PREEMPTED": "delete it and create it again, or let `supervise` do that",
               "STOPPED": f"start it: {verb_line(args, 'start-vm')}",
               "CREATING": "wait until it is READY (`status`)"}.get(
                   node.state, "see `status`; `delete` and create it again if it stays so")
        raise LaunchError(f"TPU VM {args.name} is {node.state}, not READY: {fix}.")
    if args.accelerator_type and args.accelerator_type != node.accelerator_type:
        note(f"{args.name} is a {node.accelerator_type}, not {args.accelerator_type}: "
             f"using {node.accelerator_type}")
    return node


def node_lost(cloud: Cloud) -> str:
    """Why the TPU VM can no longer run a job ('' while it is READY, or when gcloud could not
    say: a failed describe is no evidence that the slice is gone)."""
    try:
        node = cloud.node()
    except CloudError:
        return ""
    if node is None:
        return "the TPU VM is gone"
    return "" if node.state == "READY" else f"the TPU VM is {node.state}"


def use_queued(args, st: SliceType) -> bool:
    """Pod slices and Spot VMs are queued resources unless --no-queued: a queued resource
    waits for capacity, where a plain create fails at once when the zone has none."""
    return (st.hosts > 1 or args.spot) if args.queued is None else args.queued


def wait_active(cloud: Cloud, args, stoppable: bool = False) -> None:
    """Poll the queued resource until ACTIVE (its TPU VMs exist), with a progress line;
    `stoppable` (supervise): a stop marker ends the wait (Stopped)."""
    if cloud.dry:
        note(f"(dry run) then poll `gcloud compute tpus queued-resources describe {args.name}` "
             "until ACTIVE")
        return
    start, last, said = time.monotonic(), None, 0.0
    while True:
        qr = cloud.queued_resource()
        state, reason = qr_state(qr) if qr else ("NOT_FOUND", "")
        waited = time.monotonic() - start
        if state != last or waited - said >= 300:
            note(f"queued resource {args.name}: {state} (waited {_duration(waited)})")
            last, said = state, waited
        if state == "ACTIVE":
            return
        if state in ("FAILED", "SUSPENDED", "SUSPENDING"):
            raise CloudError(f"queued resource {args.name} is {state}: "
                             f"{reason or 'no reason given'}. Delete it "
                             f"({verb_line(args, 'delete')}) and create it again (capacity may "
                             "be in another zone, or with --spot / --reserved).")
        if state == "NOT_FOUND":
            raise CloudError(f"queued resource {args.name} is gone (deleted while waiting?).")
        if args.wait_timeout and waited >= args.wait_timeout:
            raise CloudError(f"queued resource {args.name} is still {state} after "
                             f"{_duration(waited)}; it stays queued: run `create` again to keep "
                             f"waiting, `status` to look, or `delete` to give up.")
        if stoppable and stop_requested(args):
            raise Stopped(stop_requested(args))
        time.sleep(args.poll_seconds)


def create_command(cloud: Cloud, args, st: SliceType, queued: bool) -> list[str]:
    runtime = args.runtime_version or st.runtime
    opts = [f"--{k.replace('_', '-')}={getattr(args, k)}"
            for k in ("network", "subnetwork", "service_account", "scopes", "metadata")
            if getattr(args, k)]
    opts += ["--internal-ips"] * args.no_external_ip
    opts += ["--spot"] * args.spot + ["--reserved"] * args.reserved
    if queued:
        gcloud = ["gcloud", "alpha"] if args.best_effort else ["gcloud"]
        return (gcloud + ["compute", "tpus", "queued-resources", "create", args.name,
                          f"--node-id={args.name}", f"--accelerator-type={st.accelerator_type}",
                          f"--runtime-version={runtime}"] + cloud.where() + opts
                + ["--best-effort"] * args.best_effort)
    return (cloud.tpu("tpu-vm", "create", args.name, f"--accelerator-type={st.accelerator_type}",
                      f"--version={runtime}") + cloud.where() + opts)


def create(cloud: Cloud, args, stoppable: bool = False) -> None:
    if not args.accelerator_type:
        raise LaunchError("create needs --accelerator-type (e.g. v4-8, v5p-32, v5litepod-16).")
    st = parse_accelerator_type(args.accelerator_type)
    queued = use_queued(args, st)
    if args.queued is None and queued:
        what = f"a pod slice ({st.hosts} hosts)" if st.hosts > 1 else "Spot"
        note(f"{st.accelerator_type} is {what}: creating a queued resource, which waits for "
             "capacity (--no-queued for a plain create)")
    if args.best_effort and not queued:
        raise LaunchError("--best-effort exists only for queued resources; add --queued.")
    if args.best_effort:
        note(ALPHA_HINT)
    exists = None
    if not cloud.dry:
        exists = cloud.queued_resource() if queued else cloud.node()
    if exists is not None:
        state = qr_state(exists)[0] if queued else exists.state
        if queued and state in ("FAILED", "SUSPENDED", "SUSPENDING"):
            wait_active(cloud, args, stoppable)  # raises with gcloud's reason
        note(f"{args.name} exists already ({state}): not creating it again")
    elif cloud.run(create_command(cloud, args, st, queued)) != 0:
        raise CloudError(f"creating {args.name} failed: {last_lines(cloud.last_error)}"
                         + (" " + ALPHA_HINT if args.best_effort else ""))
    if queued:
        wait_active(cloud, args, stoppable)
    elif not cloud.dry and exists is not None and exists.state != "READY":
        raise LaunchError(f"TPU VM {args.name} is {exists.state}: `delete` it and create again.")


def stop_vm(cloud: Cloud, args) -> int:
    if resolve_kind(cloud, args) == "queued":
        raise LaunchError(f"{args.name} is a queued resource, whose TPU can only be deleted, not "
                          f"stopped: {verb_line(args, 'delete')}")
    if not cloud.dry:
        mark_stopped(args, "stop-vm")
    graceful_stop(cloud, args)
    cloud.check(cloud.tpu("tpu-vm", "stop", args.name) + cloud.where(), "stopping the TPU VM")
    if not cloud.dry:
        note(f"{args.name} is stopped: the TPU is no longer billed; "
             f"{verb_line(args, 'start-vm')} starts it again, {verb_line(args, 'delete')} "
             "removes it.")
    return 0


def start_vm(cloud: Cloud, args) -> int:
    cloud.check(cloud.tpu("tpu-vm", "start", args.name) + cloud.where(), "starting the TPU VM")
    if not cloud.dry:
        note(f"{args.name} is running (and billing) again; its disk kept the setup: `train` next.")
    return 0


def graceful_stop(cloud: Cloud, args) -> None:
    """Before the VM goes: let a running job save a checkpoint and copy its logs."""
    if cloud.dry or getattr(args, "no_stop_job", False):
        return
    node = cloud.node()
    if node is None or node.state != "READY":
        return
    try:
        check_ssh_agent(node.workers)
    except LaunchError as e:
        note(f"not stopping the job first ({e})")
        return
    cloud.run(cloud.ssh_cmd(f"test -f {REMOTE_DIR}/launch/tpu_job.sh && "
                            f"{JOB} stop --grace {args.grace} || true"))


def delete_resource(cloud: Cloud, args, kind: str) -> None:
    if kind == "queued":  # --force also deletes the TPU VM the queued resource created
        cmd = cloud.tpu("queued-resources", "delete", args.name) + cloud.where() + [
            "--force", "--quiet"]
    else:
        cmd = cloud.tpu("tpu-vm", "delete", args.name) + cloud.where() + ["--quiet"]
    cloud.check(cmd, f"deleting {args.name}")


def delete(cloud: Cloud, args) -> int:
    kind = resolve_kind(cloud, args)
    if not cloud.dry:  # first: a supervise of this TPU must not recreate it
        mark_stopped(args, "delete")
    graceful_stop(cloud, args)
    delete_resource(cloud, args, kind)
    if not cloud.dry:
        note(f"{args.name} is deleted: billing for it stopped.")
    return 0


def status(cloud: Cloud, args) -> int:
    kind = resolve_kind(cloud, args)
    cmd = cloud.tpu("queued-resources" if kind == "queued" else "tpu-vm", "describe",
                    args.name) + cloud.where()
    return cloud.run(cmd)


def stop_ambiguous(cloud: Cloud, args) -> int:
    raise LaunchError("`stop` is ambiguous: `stop-job` ends training and leaves the VM running "
                      "(still billed); `delete` (or `stop-vm` for a single-host TPU VM) stops "
                      "the billing.")
