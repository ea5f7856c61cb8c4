"""The training job on the workers: the `t5lite train` line every worker runs, launch/tpu_job.sh
(start or attach, stop, log copies) and the one line each worker ends with,
`t5lite-job: worker N exit RC [stopped] | refused | lost`, read into an Outcome."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import os
import re
import secrets
import shlex
import tempfile

from .fit_check import fit_check
from .gcloud import Cloud, Node, check_ssh_agent
from .layout import JOB, LOG_LINK, REPO_ROOT, VENV_PYTHON, WORKER_LOGS
from .messages import LaunchError, note, verb_line
from .preflight import check_bucket
from .slices import parse_accelerator_type
from .stopmark import mark_stopped
from .vm import node_lost, require_node

EXIT_PREEMPTED = 75  # t5lite train: "preempted, checkpoint saved; rerun to resume" (EX_TEMPFAIL)
JOB_LINE = re.compile(r"t5lite-job: worker (\S+) (exit (\d+)( stopped)?|refused|lost)")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set on every worker unless --env names them. libtpu: its full log goes to /tmp/tpu_logs
# (level 0, the Cloud TPU default), and warnings, errors and FATAL also to stderr, i.e. into
# the job log and its copy in the workdir (0 adds libtpu's INFO lines there). TensorStore
# (orbax's gs:// I/O): a transfer slower than 256 bytes/s for 60 s is retried instead of
# stalling a checkpoint; the values jax's cloud_tpu_init defaults to, set here so that they
# hold whatever imports first. LIBTPU_INIT_ARGS (worker_env): the slice generation's
# asynchronous-collective flags, from the table `t5lite compile` and `t5lite train` read.
ENV_PRESETS = {"TPU_MIN_LOG_LEVEL": "0", "TPU_STDERR_LOG_LEVEL": "1",
               "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": "60",
               "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES": "256"}


def user_env(args) -> dict[str, str]:
    """--env NAME=VALUE items (the values may be secrets: never printed or logged)."""
    env = {}
    for item in args.env or []:
        key, sep, value = item.partition("=")
        if not sep or not ENV_NAME.fullmatch(key):
            raise LaunchError(f"--env {key if sep else item!r}: give NAME=VALUE (NAME: letters, "
                              "digits and _).")
        env[key] = value
    return env


def _xla_flags():
    """t5lite/mesh/xla_flags.py, loaded by its path (standard library only; this launcher
    runs where t5lite may not be installed)."""
    path = os.path.join(REPO_ROOT, "t5lite", "mesh", "xla_flags.py")
    spec = importlib.util.spec_from_file_location("t5lite_xla_flags", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker_env(accelerator_type: str = "") -> dict[str, str]:
    """ENV_PRESETS, and LIBTPU_INIT_ARGS with the generation's asynchronous-collective flags
    (t5lite/mesh/xla_flags.py: the options `t5lite train` passes to each program it compiles,
    here for every program of the process) when the slice's generation has any."""
    env = dict(ENV_PRESETS)
    if accelerator_type:
        flags = _xla_flags().libtpu_init_args(parse_accelerator_type(accelerator_type)
                                              .generation)
        if flags:
            env["LIBTPU_INIT_ARGS"] = flags
    return env


def train_command_line(args, accelerator_type: str = "") -> list[str]:
    """The `t5lite train` invocation every worker runs (identical on all hosts) on a slice of
    ``accelerator_type``; --env values travel in a file (env_file_text), never on this line,
    and replace worker_env's."""
    if not args.workdir.startswith("gs://"):
        raise LaunchError(f"--workdir={args.workdir!r}: use a GCS path (gs://BUCKET/PATH). "
                          "All hosts must write one checkpoint together, and a TPU VM's disk "
                          "is deleted with the VM.")
    mine = user_env(args)
    presets = [f"{k}={v}" for k, v in worker_env(accelerator_type).items() if k not in mine]
    cmd = ["env", *presets, VENV_PYTHON, "-m", "t5lite.cli", "train", f"--config={args.config}",
           f"--workdir={args.workdir}", "--set", "mesh.multihost=true"]
    for item in args.set or []:
        cmd += ["--set", item]
    return cmd


def env_file_text(env: dict[str, str]) -> str:
    """What tpu_job.sh sources before the command (shell-quoted; one export per line)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def env_file_remote(job_id: str) -> str:
    return f"t5lite-env-{job_id}"  # in the worker's home; tpu_job.sh moves it (mode 600)


def job_remote(args, job_id: str, detach: bool, accelerator_type: str = "") -> str:
    logs_url = args.workdir.rstrip("/") + "/" + WORKER_LOGS
    # the venv path stays unquoted so that the remote shell expands ~
    train = " ".join(w if w == VENV_PYTHON else shlex.quote(w)
                     for w in train_command_line(args, accelerator_type))
    env_file = f" --env-file {env_file_remote(job_id)}" if args.env else ""
    return (f"{JOB} run{' --detach' * detach} --job-id {job_id}{env_file} --logs-url "
            f"{shlex.quote(logs_url)} --sync-every {args.sync_logs_every} -- {train}")


def ship_env(cloud: Cloud, args, job_id: str) -> None:
    """Copy the --env values to every worker in a file only the user can read."""
    env = user_env(args)
    if not env:
        return
    note("--env " + ", ".join(f"{k}=***" for k in env) + " (values in a file on the workers, "
         "readable only by you)")
    if cloud.dry:
        cloud.run(cloud.scp_cmd(os.path.join(tempfile.gettempdir(), "t5lite-env-FILE"),
                                env_file_remote(job_id)))
        return
    fd, path = tempfile.mkstemp(prefix="t5lite-env-")  # mode 600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(env_file_text(env))
        cloud.check(cloud.scp_cmd(path, env_file_remote(job_id)), "copying --env to the workers")
    finally:
        os.remove(path)


def new_job_id() -> str:
    """A time-ordered id that two `train`s in the same second still do not share (a worker
    reports, instead of running, a job whose id it has seen end)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{secrets.token_hex(3)}"


@dataclasses.dataclass
class Outcome:
    kind: str  # done | preempted | stopped | failed | refused | disconnected | lost | started
    rc: int
    detail: str = ""


def job_outcome(lines: list[str], ssh_rc: int, workers: int) -> Outcome:
    exits, refused, lost, stopped = {}, [], [], []
    for line in lines:
        m = JOB_LINE.search(line)
        if m and m.group(3) is not None:
            exits[m.group(1)] = int(m.group(3))
            if m.group(4):
                stopped.append(m.group(1))
        elif m and m.group(2) == "refused":
            refused.append(m.group(1))
        elif m:
            lost.append(m.group(1))
    if refused:
        return Outcome("refused", 3, f"worker(s) {', '.join(refused)} run another job")
    if stopped:
        return Outcome("stopped", exits[stopped[0]],
                       f"stopped by stop-job on worker(s) {', '.join(stopped)}")
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


def run_job(cloud: Cloud, args, node: Node, detach: bool, watch=None) -> Outcome:
    """Start (or attach to) the job on every worker and wait for its end. `watch` (default: is
    the TPU VM still READY?) runs every --poll-seconds meanwhile: a slice preempted or deleted
    under the job ends the wait at once ('lost'), whatever the ssh connection does."""
    job_id = new_job_id()
    ship_env(cloud, args, job_id)
    rc, lines = cloud.stream(cloud.ssh_cmd(job_remote(args, job_id, detach,
                                                       node.accelerator_type)),
                             watch=None if detach else (watch or (lambda: node_lost(cloud))),
                             every=args.poll_seconds)
    if cloud.dry:
        return Outcome("done", 0)
    if cloud.ended_by:
        return Outcome("lost", 1, cloud.ended_by)
    if detach:
        started = sum(" started job " in ln or " attached to " in ln for ln in lines)
        if started >= node.workers:
            return Outcome("started", 0)
    return job_outcome(lines, rc, node.workers)


def train(cloud: Cloud, args) -> int:
    train_command_line(args)  # validate before touching anything
    node = require_node(cloud, args)
    fit_check(args, node.accelerator_type)
    check_bucket(cloud, args)
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
    elif out.kind == "stopped":
        note(f"training was stopped ({out.detail}); its checkpoint is saved. {billing}")
    elif out.kind == "lost":
        note(f"{out.detail}: the job ended with it (its last checkpoint is in the workdir). "
             f"`supervise` recreates the slice and resumes; logs are in {log_copies}.")
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
    if not cloud.dry:  # first: a supervise of this TPU (even one still waiting for capacity)
        mark_stopped(args, "stop-job")  # must not take the stop for a preemption
    node = require_node(cloud, args)
    check_ssh_agent(0 if cloud.dry else node.workers)
    rc = cloud.run(cloud.ssh_cmd(f"{JOB} stop --grace {args.grace}"))
    if not cloud.dry:
        note(f"training stopped (its last checkpoint and logs are saved); {args.name} is "
             f"still running and billing: {verb_line(args, 'delete')} (or `stop-vm` for a "
             "single-host TPU VM) stops that.")
    return rc
