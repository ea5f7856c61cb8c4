"""The training job on the workers: the `t5lite train` line every worker runs, launch/tpu_job.sh
(start or attach, stop, log copies) and the one line each worker ends with,
`t5lite-job: worker N exit RC | refused | lost`, read into an Outcome."""

from __future__ import annotations

import dataclasses
import datetime
import re
import shlex

from .fit_check import fit_check
from .gcloud import Cloud, Node, check_ssh_agent
from .layout import JOB, LOG_LINK, VENV_PYTHON, WORKER_LOGS
from .messages import LaunchError, note, verb_line
from .vm import require_node

EXIT_PREEMPTED = 75  # t5lite train: "preempted, checkpoint saved; rerun to resume" (EX_TEMPFAIL)
JOB_LINE = re.compile(r"t5lite-job: worker (\S+) (exit (\d+)|refused|lost)")


def train_command_line(args) -> list[str]:
    """The `t5lite train` invocation every worker runs (identical on all hosts)."""
    if not args.workdir.startswith("gs://"):
        raise LaunchError(f"--workdir={args.workdir!r}: use a GCS path (gs://BUCKET/PATH). "
                          "All hosts must write one checkpoint together, and a TPU VM's disk "
                          "is deleted with the VM.")
    env = []
    for item in args.env or []:
        key, sep, _ = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise LaunchError(f"--env {item!r} must look like NAME=VALUE.")
        env.append(item)
    cmd = (["env", *env] if env else []) + [
        VENV_PYTHON, "-m", "t5lite.cli", "train", f"--config={args.config}",
        f"--workdir={args.workdir}", "--set", "mesh.multihost=true"]
    for item in args.set or []:
        cmd += ["--set", item]
    return cmd


def job_remote(args, job_id: str, detach: bool) -> str:
    logs_url = args.workdir.rstrip("/") + "/" + WORKER_LOGS
    # the venv path stays unquoted so that the remote shell expands ~
    train = " ".join(w if w == VENV_PYTHON else shlex.quote(w) for w in train_command_line(args))
    return (f"{JOB} run{' --detach' * detach} --job-id {job_id} --logs-url "
            f"{shlex.quote(logs_url)} --sync-every {args.sync_logs_every} -- {train}")


@dataclasses.dataclass
class Outcome:
    kind: str  # done | preempted | failed | refused | disconnected | started
    rc: int
    detail: str = ""


def job_outcome(lines: list[str], ssh_rc: int, workers: int) -> Outcome:
    exits, refused, lost = {}, [], []
    for line in lines:
        m = JOB_LINE.search(line)
        if m and m.group(3) is not None:
            exits[m.group(1)] = int(m.group(3))
        elif m and m.group(2) == "refused":
            refused.append(m.group(1))
        elif m:
            lost.append(m.group(1))
    if refused:
        return Outcome("refused", 3, f"worker(s) {', '.join(refused)} run another job")
    bad = {w: c for w, c in exits.items() if c not in (0, EXIT_PREEMPTED)}
    if bad:
        w, c = next(iter(bad.items()))
        return Outcome("failed", c, f"worker {w} exited {c}")
    if len(exits) < workers:
        return Outcome("disconnected", ssh_rc or 1,
                       f"{workers - len(exits)} of {workers} worker(s) did not report an exit "
                       f"code (ssh exit {ssh_rc})" + (f"; lost: {', '.join(lost)}" if lost else ""))
    if any(c == EXIT_PREEMPTED for c in exits.values()):
        return Outcome("preempted", EXIT_PREEMPTED)
    return Outcome("done", 0)


def run_job(cloud: Cloud, args, node: Node, detach: bool) -> Outcome:
    job_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    rc, lines = cloud.stream(cloud.ssh_cmd(job_remote(args, job_id, detach)))
    if cloud.dry:
        return Outcome("done", 0)
    if detach:
        started = sum(" started job " in ln or " attached to " in ln for ln in lines)
        if started >= node.workers:
            return Outcome("started", 0)
    return job_outcome(lines, rc, node.workers)


def train(cloud: Cloud, args) -> int:
    train_command_line(args)  # validate before touching anything
    node = require_node(cloud, args)
    fit_check(args, node.accelerator_type)
    check_ssh_agent(0 if cloud.dry else node.workers)
    out = run_job(cloud, args, node, args.detach)
    log_copies = f"{args.workdir.rstrip('/')}/{WORKER_LOGS}/"
    billing = (f"{args.name} is still running and billing: {verb_line(args, 'delete')} "
               "stops that.")
    if cloud.dry:
        return 0
    if out.kind == "started":
        note(f"training started on {node.workers} worker(s); follow it with "
             f"{verb_line(args, 'logs')}; logs are copied to {log_copies}. {billing}")
    elif out.kind == "done":
        note(f"training finished on all {node.workers} worker(s). {billing}")
    elif out.kind == "preempted":
        note(f"preempted (exit {EXIT_PREEMPTED}): the checkpoint is saved; run the same `train` "
             "again to resume (or use `supervise`, which does that).")
    elif out.kind == "disconnected":
        note(f"lost the connection: {out.detail}. A running job goes on without it: `train` "
             f"again attaches to it; {verb_line(args, 'logs')} shows it; copies in {log_copies}.")
    elif out.kind == "refused":
        note(f"not started: {out.detail}; stop it first: {verb_line(args, 'stop-job')}")
    else:
        note(f"training failed: {out.detail}; logs above and in {log_copies}. {billing}")
    return out.rc


def logs(cloud: Cloud, args) -> int:
    if args.sync:
        node = require_node(cloud, args)
        check_ssh_agent(0 if cloud.dry else node.workers)
        return cloud.run(cloud.ssh_cmd(f"{JOB} sync-logs"))
    node = None if cloud.dry else cloud.node()
    if cloud.dry or (node is not None and node.state == "READY"):
        if args.worker == "all":
            check_ssh_agent(0 if cloud.dry else node.workers)
        follow = "-F " if args.follow else ""
        return cloud.run(cloud.ssh_cmd(f"tail -n {args.lines} {follow}{LOG_LINK}",
                                       worker=args.worker))
    if not args.workdir:
        raise LaunchError(f"TPU VM {args.name} is {node.state if node else 'gone'}: pass "
                          f"--workdir=gs://... to read the log copies in WORKDIR/{WORKER_LOGS}/.")
    worker = "*" if args.worker == "all" else args.worker
    return cloud.run(["gcloud", "storage", "cat",
                      f"{args.workdir.rstrip('/')}/{WORKER_LOGS}/*/worker-{worker}.log"])


def stop_job(cloud: Cloud, args) -> int:
    node = require_node(cloud, args)
    check_ssh_agent(0 if cloud.dry else node.workers)
    rc = cloud.run(cloud.ssh_cmd(f"{JOB} stop --grace {args.grace}"))
    if not cloud.dry:
        note(f"training stopped (its last checkpoint and logs are saved); {args.name} is "
             f"still running and billing: {verb_line(args, 'delete')} (or `stop-vm` for a "
             "single-host TPU VM) stops that.")
    return rc
