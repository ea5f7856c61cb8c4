#!/usr/bin/env python3
"""Create, set up, train on, supervise and delete a Cloud TPU VM or pod slice with `gcloud`.

    python launch/tpu_vm.py create    my-tpu --zone=us-central2-b --accelerator-type=v4-8
    python launch/tpu_vm.py setup     my-tpu --zone=us-central2-b
    python launch/tpu_vm.py train     my-tpu --zone=us-central2-b \\
        --config=configs/t5_1_1_small.py --workdir=gs://my-bucket/runs/small
    python launch/tpu_vm.py stop-job  my-tpu --zone=us-central2-b   # the VM keeps billing
    python launch/tpu_vm.py delete    my-tpu --zone=us-central2-b   # billing stops

`supervise` does create + setup + train and repeats them after a preemption until the run
reaches its last step. `--dry-run` prints the gcloud commands instead of running them (one per
line, shell-quoted; the state checks between them are described on stderr). Standard library
only, so it runs on any laptop with gcloud.

On a pod slice (more than one host) every command that touches the VMs runs on all workers at
once (`--worker=all`): each host runs the same `t5lite train`, and jax.distributed.initialize()
finds the other hosts by itself (mesh.multihost=true). The job on each worker is run by
launch/tpu_job.sh (idempotent start, log copies to WORKDIR/worker_logs/).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOTE_DIR = "~/t5lite"  # where the code lives on every worker
# The TPU images' system Python is 3.10; the pinned jax / flax / orbax need >= 3.11. setup makes
# a venv with uv (pip-installed for the user: no root, no apt lock on a booting VM, the same
# interpreter on every image; uv downloads a standalone CPython build), as MaxText does.
VENV = "~/t5lite-venv"
VENV_PYTHON = VENV + "/bin/python"
PYTHON_VERSION = "3.12"
SETUP_MARK = VENV + "/.t5lite-setup"  # written when setup finished on a worker
LOG_LINK = "~/t5lite-train.log"  # tpu_job.sh: the current job's log on each worker
JOB = f"bash {REMOTE_DIR}/launch/tpu_job.sh"
WORKER_LOGS = "worker_logs"  # WORKDIR/worker_logs/<job id>/worker-<N>.log
EXIT_PREEMPTED = 75  # t5lite train: "preempted, checkpoint saved; rerun to resume" (EX_TEMPFAIL)
JOB_LINE = re.compile(r"t5lite-job: worker (\S+) (exit (\d+)|refused|lost)")
ALPHA_HINT = ("--best-effort runs `gcloud alpha`, which needs gcloud's alpha component: "
              "`gcloud components install alpha` (or the google-cloud-cli-alpha package).")


class LaunchError(Exception):
    """A mistake in the launcher's arguments or local setup; the message says what to do (exit 2).

    (Not t5lite.errors.UserError: this script runs where t5lite may not be installed.)
    """


class CloudError(Exception):
    """The cloud said no (a failed queued resource, a timeout): exit 1 with gcloud's reason."""


# ----------------------------------------------------------------------------- slice types


@dataclasses.dataclass(frozen=True)
class Generation:
    """How one TPU generation names its slices and maps them onto hosts (TPU VMs)."""

    unit: str  # what the number in "v4-32" counts: "cores" (TensorCores) or "chips"
    per_host: int  # cores or chips per host in a multi-host slice
    single_host_max: int  # largest size that fits on one host
    sizes: tuple  # allowed sizes; () = any multiple of per_host up to max_size
    max_size: int
    runtime: str  # default --runtime-version (Cloud TPU docs: "TPU software versions")


GENERATIONS = {
    "v2": Generation("cores", 8, 8, (8, 32, 128, 256, 512), 512, "tpu-ubuntu2204-base"),
    "v3": Generation("cores", 8, 8, (8, 32, 64, 128, 256, 512, 1024, 2048), 2048,
                     "tpu-ubuntu2204-base"),
    "v4": Generation("cores", 8, 8, (), 8192, "tpu-ubuntu2204-base"),
    "v5p": Generation("cores", 8, 8, (), 12288, "v2-alpha-tpuv5"),
    # v5e / v6e: 1, 4 or 8 chips on one VM; bigger slices are 4-chip VMs.
    "v5litepod": Generation("chips", 4, 8, (1, 4, 8, 16, 32, 64, 128, 256), 256,
                            "v2-alpha-tpuv5-lite"),
    "v6e": Generation("chips", 4, 8, (1, 4, 8, 16, 32, 64, 128, 256), 256, "v2-alpha-tpuv6e"),
}
ALIASES = {"v5e": "v5litepod", "v5lite": "v5litepod", "v6": "v6e"}


@dataclasses.dataclass(frozen=True)
class SliceType:
    accelerator_type: str
    generation: str
    size: int
    hosts: int
    runtime: str


def parse_accelerator_type(accelerator_type: str) -> SliceType:
    """'v5p-32' -> SliceType(hosts=4, ...); unknown or impossible shapes raise LaunchError."""
    m = re.fullmatch(r"([a-z0-9]+)-(\d+)", accelerator_type.strip().lower())
    known = ", ".join(f"{g}-N" for g in GENERATIONS)
    if not m:
        raise LaunchError(f"accelerator type {accelerator_type!r} is not GENERATION-SIZE; "
                          f"use one of {known} (e.g. v4-8, v5p-32, v5litepod-16).")
    gen_name, size = m.group(1), int(m.group(2))
    if gen_name in ALIASES:
        raise LaunchError(f"gcloud calls {gen_name} slices '{ALIASES[gen_name]}-N': "
                          f"use --accelerator-type={ALIASES[gen_name]}-{size}.")
    if gen_name not in GENERATIONS:
        hint = difflib.get_close_matches(gen_name, list(GENERATIONS), n=1)
        raise LaunchError(f"unknown TPU generation {gen_name!r} in {accelerator_type!r}"
                          + (f"; did you mean {hint[0]}-{size}?" if hint else ".")
                          + f" Known: {known}.")
    gen = GENERATIONS[gen_name]
    valid = (size in gen.sizes) if gen.sizes else (
        0 < size <= gen.max_size and size % gen.per_host == 0)
    if not valid:
        allowed = ("one of " + ", ".join(str(s) for s in gen.sizes) if gen.sizes else
                   f"a multiple of {gen.per_host} up to {gen.max_size}")
        raise LaunchError(f"{accelerator_type}: the size of a {gen_name} slice counts "
                          f"{gen.unit} and must be {allowed}.")
    hosts = 1 if size <= gen.single_host_max else size // gen.per_host
    return SliceType(f"{gen_name}-{size}", gen_name, size, hosts, gen.runtime)


# ----------------------------------------------------------------------------- gcloud


def note(msg: str) -> None:
    print(f"tpu_vm.py: {msg}", file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclasses.dataclass
class Node:
    """What `describe` says about the TPU VM(s)."""

    state: str
    accelerator_type: str
    workers: int


class Cloud:
    """Runs (or, with --dry-run, prints) gcloud commands for one named TPU."""

    def __init__(self, args):
        self.args, self.name, self.dry = args, args.name, args.dry_run

    def where(self) -> list[str]:
        """--zone / --project (omitted = gcloud's configured default)."""
        a = self.args
        return ([f"--zone={a.zone}"] if a.zone else []) + (
            [f"--project={a.project}"] if a.project else [])

    def conn(self) -> list[str]:
        """How ssh/scp reach the workers (internal IPs, IAP)."""
        a = self.args
        return ["--internal-ip"] * a.internal_ip + ["--tunnel-through-iap"] * a.tunnel_through_iap

    def tpu(self, *words) -> list[str]:
        return ["gcloud", "compute", "tpus", *words]

    def tpu_conn(self, *words) -> list[str]:
        """ssh / scp: `tpu-vm ssh --tunnel-through-iap` exists only in `gcloud alpha`."""
        alpha = ["alpha"] * self.args.tunnel_through_iap
        return ["gcloud", *alpha, "compute", "tpus", *words]

    def ssh_cmd(self, remote: str, worker="all") -> list[str]:
        return (self.tpu_conn("tpu-vm", "ssh", self.name, f"--worker={worker}") + self.where()
                + self.conn() + ["--command", remote])

    def run(self, cmd: list[str]) -> int:
        if self.dry:
            print(shlex.join(cmd), flush=True)
            return 0
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        try:
            return subprocess.call(cmd)
        except FileNotFoundError:
            raise LaunchError(f"{cmd[0]!r} not found; install the Google Cloud CLI "
                              "(https://cloud.google.com/sdk) or use --dry-run.") from None

    def check(self, cmd: list[str], what: str) -> None:
        rc = self.run(cmd)
        if rc != 0:
            raise CloudError(f"{what} failed (exit {rc}); gcloud's message is above.")

    def query(self, cmd: list[str]) -> tuple[int, str, str]:
        assert not self.dry, cmd
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            raise LaunchError(f"{cmd[0]!r} not found; install the Google Cloud CLI "
                              "(https://cloud.google.com/sdk) or use --dry-run.") from None
        return r.returncode, r.stdout, r.stderr

    def stream(self, cmd: list[str]) -> tuple[int, list[str]]:
        """Run, echo its output as it comes, and return (exit code, output lines)."""
        if self.dry:
            return self.run(cmd), []
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        lines = []
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, bufsize=1)
        except FileNotFoundError:
            raise LaunchError(f"{cmd[0]!r} not found; install the Google Cloud CLI "
                              "(https://cloud.google.com/sdk) or use --dry-run.") from None
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line.rstrip("\n"))
        return p.wait(), lines

    def _describe(self, kind: str) -> dict | None:
        rc, out, err = self.query(self.tpu(kind, "describe", self.name) + self.where()
                                  + ["--format=json"])
        if rc == 0:
            return json.loads(out)
        if re.search(r"NOT_FOUND|not found|was not found", err, re.I):
            return None
        raise CloudError(f"gcloud {kind} describe {self.name} failed: {err.strip()[-500:]}")

    def queued_resource(self) -> dict | None:
        return self._describe("queued-resources")

    def node(self) -> Node | None:
        d = self._describe("tpu-vm")
        if d is None:
            return None
        acc = d.get("acceleratorType", "").rsplit("/", 1)[-1]
        workers = len(d.get("networkEndpoints") or [])
        if not workers and acc:
            workers = parse_accelerator_type(acc).hosts
        return Node(d.get("state", "UNKNOWN"), acc, max(workers, 1))


def qr_state(qr: dict) -> tuple[str, str]:
    """(state, gcloud's reason) of a described queued resource."""
    st = qr.get("state") or {}
    reason = ((st.get("failedData") or {}).get("error") or {}).get("message", "")
    if not reason and st.get("stateInitiator"):
        reason = f"initiated by {st['stateInitiator']}"
    return st.get("state", "UNKNOWN"), reason


def where_text(args) -> str:
    return " ".join(f"--{k}={getattr(args, k)}" for k in ("zone", "project") if getattr(args, k))


def verb_line(args, verb: str) -> str:
    return f"python launch/tpu_vm.py {verb} {args.name} {where_text(args)}".rstrip()


# ----------------------------------------------------------------------------- pieces


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


def check_ssh_agent(workers: int) -> None:
    """gcloud's `--worker=all` opens one ssh per worker at once: with a passphrase on the key
    and the key not in ssh-agent, it refuses or hangs on N passphrase prompts."""
    if workers <= 1:
        return
    key = os.path.expanduser("~/.ssh/google_compute_engine")
    fix = f'eval "$(ssh-agent -s)" && ssh-add {key}'
    if not os.path.exists(key):
        raise LaunchError(f"this slice has {workers} workers and gcloud has no ssh key yet: run "
                          f"`gcloud compute config-ssh` (it creates {key}), then: {fix}")
    try:
        no_passphrase = subprocess.run(["ssh-keygen", "-y", "-P", "", "-f", key],
                                       capture_output=True).returncode == 0
        if no_passphrase:
            return
        loaded = subprocess.run(["ssh-add", "-l"], capture_output=True, text=True)
        fingerprint = subprocess.run(["ssh-keygen", "-l", "-f", key + ".pub"],
                                     capture_output=True, text=True).stdout.split()
    except FileNotFoundError:
        raise LaunchError("ssh-keygen / ssh-add not found: install OpenSSH's client") from None
    if loaded.returncode == 0 and len(fingerprint) > 1 and fingerprint[1] in loaded.stdout:
        return
    why = ("no ssh-agent is running" if loaded.returncode == 2 or not os.environ.get(
        "SSH_AUTH_SOCK") else "ssh-agent does not hold gcloud's key")
    raise LaunchError(f"this slice has {workers} workers and {why}: gcloud's --worker=all "
                      f"needs the key in the agent. Type: {fix}")


def wait_active(cloud: Cloud, args) -> None:
    """Poll the queued resource until ACTIVE (its TPU VMs exist), with a progress line."""
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
        time.sleep(args.poll_seconds)


def create_command(cloud: Cloud, args, st: SliceType, queued: bool) -> list[str]:
    runtime = args.runtime_version or st.runtime
    opts = [f"--{k.replace('_', '-')}={getattr(args, k)}"
            for k in ("network", "subnetwork", "service_account", "scopes", "metadata")
            if getattr(args, k)]
    opts += ["--internal-ips"] * args.internal_ip
    opts += ["--spot"] * args.spot + ["--reserved"] * args.reserved
    if queued:
        gcloud = ["gcloud", "alpha"] if args.best_effort else ["gcloud"]
        return (gcloud + ["compute", "tpus", "queued-resources", "create", args.name,
                          f"--node-id={args.name}", f"--accelerator-type={st.accelerator_type}",
                          f"--runtime-version={runtime}"] + cloud.where() + opts
                + ["--best-effort"] * args.best_effort)
    return (cloud.tpu("tpu-vm", "create", args.name, f"--accelerator-type={st.accelerator_type}",
                      f"--version={runtime}") + cloud.where() + opts)


def create(cloud: Cloud, args) -> None:
    if not args.accelerator_type:
        raise LaunchError("create needs --accelerator-type (e.g. v4-8, v5p-32, v5litepod-16).")
    st = parse_accelerator_type(args.accelerator_type)
    queued = st.hosts > 1 if args.queued is None else args.queued
    if args.queued is None and queued:
        note(f"{st.accelerator_type} is a pod slice ({st.hosts} hosts): creating a queued "
             "resource, which waits for capacity (--no-queued for a plain create)")
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
            wait_active(cloud, args)  # raises with gcloud's reason
        note(f"{args.name} exists already ({state}): not creating it again")
    elif cloud.run(create_command(cloud, args, st, queued)) != 0:
        raise CloudError(f"creating {args.name} failed; gcloud's message is above."
                         + (" " + ALPHA_HINT if args.best_effort else ""))
    if queued:
        wait_active(cloud, args)
    elif not cloud.dry and exists is not None and exists.state != "READY":
        raise LaunchError(f"TPU VM {args.name} is {exists.state}: `delete` it and create again.")


def ship_commands(cloud: Cloud, args) -> tuple[list[list[str]], str]:
    """Commands that put the code on every worker, and the remote line that unpacks it."""
    if args.repo:
        branch = f"--branch {shlex.quote(args.branch)} " if args.branch else ""
        return [], (f"rm -rf {REMOTE_DIR} && git clone --depth 1 {branch}"
                    f"{shlex.quote(args.repo)} {REMOTE_DIR}")
    # ship this checkout's HEAD (committed files only) to every worker
    if not cloud.dry:
        dirty = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True).stdout
        if dirty.strip():
            note("shipping HEAD: uncommitted changes are not copied (commit them first)")
    archive = os.path.join(tempfile.gettempdir(), f"t5lite-src-{args.name}.tar.gz")
    if not cloud.dry:  # one file per run: two launchers on this machine must not share it
        fd, archive = tempfile.mkstemp(prefix=f"t5lite-src-{args.name}-", suffix=".tar.gz")
        os.close(fd)
    return ([["git", "-C", REPO_ROOT, "archive", "--format=tar.gz", f"--output={archive}", "HEAD"],
             cloud.tpu_conn("tpu-vm", "scp", archive, f"{args.name}:t5lite-src.tar.gz",
                       "--worker=all") + cloud.where() + cloud.conn()],
            f"rm -rf {REMOTE_DIR} && mkdir -p {REMOTE_DIR} && "
            f"tar -xzf ~/t5lite-src.tar.gz -C {REMOTE_DIR}")


def setup_script(fetch: str, prepare_data: bool) -> str:
    steps = [
        # never pull the code from under a running job
        f"if [ -n \"$({JOB} status 2>/dev/null | grep ' running ')\" ]; then echo "
        "'t5lite-setup: a job is running on this worker: stop-job first' >&2; exit 3; fi",
        fetch, f"cd {REMOTE_DIR}",
        "(python3 -m pip install --user --quiet --upgrade uv || python3 -m pip install --user "
        "--quiet --upgrade --break-system-packages uv)",
        f"({VENV_PYTHON} -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null || "
        f"(rm -rf {VENV} && python3 -m uv venv --python {PYTHON_VERSION} {VENV}))",
        f"python3 -m uv pip install --python {VENV_PYTHON} -e '.[tpu]'",
    ]
    if prepare_data:
        steps.append(f"{VENV_PYTHON} -m t5lite.cli data prepare")
    steps += [f"date -u > {SETUP_MARK}", "echo t5lite-setup: ok"]
    return "set -e; " + " && ".join(steps)


def setup(cloud: Cloud, args, node: Node | None = None) -> None:
    node = node or require_node(cloud, args)
    check_ssh_agent(0 if cloud.dry else node.workers)
    cmds, fetch = ship_commands(cloud, args)
    try:
        for cmd in cmds:
            if cmd[0] == "git":
                if cloud.run(cmd) != 0:
                    raise LaunchError("git archive failed: run setup from a git checkout, or "
                                      "pass --repo=URL")
            else:
                cloud.check(cmd, "copying the code to the workers")
    finally:
        if cmds and not cloud.dry:
            os.remove(cmds[0][-2].removeprefix("--output="))  # git archive's file
    rc, lines = cloud.stream(cloud.ssh_cmd(setup_script(fetch, args.prepare_data)))
    ok = sum(line.strip() == "t5lite-setup: ok" for line in lines)
    if not cloud.dry and (rc != 0 or ok < node.workers):
        raise CloudError(f"setup failed on {node.workers - ok} of {node.workers} worker(s) "
                         "(output above); fix it and run setup again.")


def setup_done(cloud: Cloud, node: Node) -> bool:
    rc, lines = cloud.stream(cloud.ssh_cmd(
        f"test -f {SETUP_MARK} && test -f {REMOTE_DIR}/launch/tpu_job.sh && "
        "echo t5lite-setup: ok || echo t5lite-setup: missing"))
    return sum(line.strip() == "t5lite-setup: ok" for line in lines) >= node.workers


# ----------------------------------------------------------------------------- fit check


def _gib(n) -> str:
    return f"{n / 2 ** 30:.1f}"


def fit_check(args, accelerator_type: str) -> None:
    """Compile the train step for the slice here (`t5lite compile`) and refuse what won't fit."""
    if args.skip_fit_check:
        return
    if not accelerator_type:
        note("(dry run) no --accelerator-type: fit check skipped")
        return
    cmd = [sys.executable, "-m", "t5lite.cli", "compile", "--config", args.config,
           "--topology", accelerator_type]
    for item in args.set or []:
        cmd += ["--set", item]
    cmd.append("--json")
    note(f"fit check: compiling {args.config} for {accelerator_type} on this machine "
         "(--skip-fit-check skips it)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p))
    # Only one process may load libtpu unless this is set; the compile targets an abstract
    # topology and never opens a TPU, so it may run beside another compile or test.
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env)
    last = (r.stderr.strip().splitlines() or [""])[-1]
    oom = re.search(r"(?s)RESOURCE_EXHAUSTED.*?required for ([\w ]+?) \(([\d.]+)([KMGT])\) "
                    r"exceeds available HBM \(([\d.]+)([KMGT])\)", r.stderr)
    if r.returncode != 0 and oom:  # XLA itself refused: it does not fit
        scale = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
        need = float(oom.group(2)) * scale[oom.group(3)]
        hbm = float(oom.group(4)) * scale[oom.group(5)]
        st = parse_accelerator_type(accelerator_type)
        sets = dict(item.split("=", 1) for item in args.set or [] if "=" in item)
        report = {"chips": st.size // 2 if GENERATIONS[st.generation].unit == "cores" else st.size,
                  "mesh": {k: int(sets.get(f"mesh.{k}", v)) for k, v in
                           (("data", -1), ("fsdp", 1), ("tensor", 1))},
                  "bytes_per_chip": {"temp" if "tempor" in oom.group(1) else "params": need}}
        raise LaunchError(f"{args.config} does not fit {accelerator_type}: the compiler needs "
                          f"{_gib(need)} GiB of HBM per chip for {oom.group(1)}, "
                          f"{_gib(hbm)} GiB available. Try "
                          + "; ".join(fit_fixes(report, args.set or []))
                          + f"; `t5lite compile --config {args.config} --topology "
                          f"{accelerator_type} --search` ranks the settings that fit. Or pass "
                          "--skip-fit-check.")
    if r.returncode != 0:
        if "No module named" in r.stderr:
            raise LaunchError("the fit check compiles for the TPU on this machine and needs "
                              "t5lite's dependencies with jax[tpu] (libtpu): pip install -e "
                              f"'.[tpu]' (or pass --skip-fit-check). ({last})")
        # exit 2: t5lite's one-line error (e.g. no libtpu: it says what to install)
        last = last.removeprefix("t5lite: error: ")
        raise LaunchError(f"fit check failed: {last} (or pass --skip-fit-check)")
    try:
        report = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise LaunchError("fit check: `t5lite compile --json` printed no JSON "
                          "(pass --skip-fit-check to start anyway)") from None
    per_chip = report.get("bytes_per_chip") or {}
    hbm = report.get("hbm_bytes_per_chip") or 0
    used = f"{_gib(per_chip.get('total', 0))} of {_gib(hbm)} GiB HBM per chip"
    if report.get("fits"):
        extra = ""
        if report.get("est_step_seconds"):
            extra = f"; estimated step {report['est_step_seconds']:.3g} s"
        if report.get("est_mfu"):
            extra += f", MFU {100 * report['est_mfu']:.0f}%"
        note(f"fit check: fits {accelerator_type}: {used}{extra}")
        return
    raise LaunchError(f"{args.config} does not fit {accelerator_type}: {used} (params "
                      f"{_gib(per_chip.get('params', 0))}, optimizer "
                      f"{_gib(per_chip.get('opt_state', 0))}, temporaries "
                      f"{_gib(per_chip.get('temp', 0))}). Try "
                      + "; ".join(fit_fixes(report, args.set or []))
                      + f"; `t5lite compile --config {args.config} --topology {accelerator_type}"
                      " --search` ranks the settings that fit. Or pass --skip-fit-check.")


def fit_fixes(report: dict, overrides: list[str]) -> list[str]:
    """The --set changes that shrink what the compile report says is too big."""
    sets = dict(item.split("=", 1) for item in overrides if "=" in item)
    remat = report.get("remat", sets.get("model.remat"))
    accum = int(report.get("grad_accum_steps", sets.get("train.grad_accum_steps", 1)))
    per_chip = report.get("bytes_per_chip") or {}
    chips = int(report.get("chips") or 1)
    mesh = report.get("mesh") or {}
    if isinstance(mesh, (list, tuple)):
        mesh = dict(mesh)
    tensor = int(mesh.get("tensor", 1) or 1)
    fixes = []
    state = per_chip.get("params", 0) + per_chip.get("opt_state", 0)
    if int(mesh.get("fsdp", 1) or 1) * tensor < chips:
        fixes.append(f"--set mesh.fsdp={chips // tensor} --set mesh.data=1 (shard parameters and "
                     f"optimizer state over all {chips} chips)")
    if per_chip.get("temp", 0) >= 0.25 * state:
        if remat != "full":
            fixes.append("--set model.remat=full (recompute activations in the backward pass)")
        fixes.append(f"--set train.grad_accum_steps={accum * 2} (smaller micro-batches)")
    return fixes or ["a larger slice"]


# ----------------------------------------------------------------------------- the job


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
    logs = f"{args.workdir.rstrip('/')}/{WORKER_LOGS}/"
    billing = (f"{args.name} is still running and billing: {verb_line(args, 'delete')} "
               "stops that.")
    if cloud.dry:
        return 0
    if out.kind == "started":
        note(f"training started on {node.workers} worker(s); follow it with "
             f"{verb_line(args, 'logs')}; logs are copied to {logs}. {billing}")
    elif out.kind == "done":
        note(f"training finished on all {node.workers} worker(s). {billing}")
    elif out.kind == "preempted":
        note(f"preempted (exit {EXIT_PREEMPTED}): the checkpoint is saved; run the same `train` "
             "again to resume (or use `supervise`, which does that).")
    elif out.kind == "disconnected":
        note(f"lost the connection: {out.detail}. A running job goes on without it: `train` "
             f"again attaches to it; {verb_line(args, 'logs')} shows it; copies in {logs}.")
    elif out.kind == "refused":
        note(f"not started: {out.detail}; stop it first: {verb_line(args, 'stop-job')}")
    else:
        note(f"training failed: {out.detail}; logs above and in {logs}. {billing}")
    return out.rc


# ----------------------------------------------------------------------------- supervise


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


# ----------------------------------------------------------------------------- other verbs


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


def stop_vm(cloud: Cloud, args) -> int:
    if resolve_kind(cloud, args) == "queued":
        raise LaunchError(f"{args.name} is a queued resource, whose TPU can only be deleted, not "
                          f"stopped: {verb_line(args, 'delete')}")
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


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tpu_vm.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Billing: `stop-job` stops training only (the VM keeps "
                                       "running and billing); `delete` stops billing (`stop-vm` "
                                       "too, for single-host TPU VMs).")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("name", help="TPU VM (and queued resource) name")
    common.add_argument("--zone", default="", help="e.g. us-central2-b (default: gcloud's)")
    common.add_argument("--project", default="", help="GCP project (default: gcloud's)")
    common.add_argument("--accelerator-type", default="",
                        help="v4-8, v5p-32, v5litepod-16, v6e-8 ...; validated, hosts printed")
    common.add_argument("--queued", action=argparse.BooleanOptionalAction, default=None,
                        help="a queued resource (create: default for pod slices; other verbs "
                             "find out by themselves)")
    common.add_argument("--internal-ip", action="store_true",
                        help="ssh/scp to the workers' internal IPs (from inside the VPC); "
                             "create makes them without external IPs (--internal-ips)")
    common.add_argument("--tunnel-through-iap", action="store_true",
                        help="ssh/scp through Identity-Aware Proxy (VMs without external IPs, "
                             "from outside the VPC); runs `gcloud alpha` (gcloud components "
                             "install alpha)")
    common.add_argument("--dry-run", action="store_true",
                        help="print the gcloud commands, one per line, and run nothing")
    sub = p.add_subparsers(dest="subcommand", required=True)

    def create_opts(sp):
        sp.add_argument("--runtime-version", default="",
                        help="default per generation (v4: tpu-ubuntu2204-base, v5p: "
                             "v2-alpha-tpuv5, v5litepod: v2-alpha-tpuv5-lite, "
                             "v6e: v2-alpha-tpuv6e)")
        sp.add_argument("--spot", action="store_true", help="Spot VMs (preemptible, cheaper)")
        sp.add_argument("--best-effort", action="store_true",
                        help="queued only: best-effort quota; runs `gcloud alpha` (needs the alpha "
                             "component: gcloud components install alpha)")
        sp.add_argument("--reserved", action="store_true", help="use reserved capacity")
        for flag, what in [("network", "VPC network"), ("subnetwork", "subnetwork"),
                           ("service-account", "service account email for the VMs"),
                           ("scopes", "access scopes, comma-separated"),
                           ("metadata", "KEY=VALUE,... VM metadata")]:
            sp.add_argument(f"--{flag}", default="", help=f"{what} (gcloud --{flag})")
        sp.add_argument("--wait-timeout", type=float, default=3600,
                        help="queued: seconds to wait for ACTIVE (0 = no limit; create: "
                             "3600, supervise: no limit)")
        sp.add_argument("--poll-seconds", type=float, default=30,
                        help="queued: seconds between state checks")

    def setup_opts(sp):
        sp.add_argument("--repo", default="", help="git URL to clone (default: ship this "
                                                   "checkout's HEAD with git archive + scp)")
        sp.add_argument("--branch", default="", help="with --repo: branch or tag")
        sp.add_argument("--prepare-data", action=argparse.BooleanOptionalAction, default=True,
                        help="run `t5lite data prepare` on every worker (default: yes)")

    def train_opts(sp):
        sp.add_argument("--config", required=True, help="configs/NAME.py (path inside the repo)")
        sp.add_argument("--workdir", required=True, help="gs://BUCKET/PATH for checkpoints; "
                                                         "worker logs go to WORKDIR/worker_logs/")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")
        sp.add_argument("--env", action="append", metavar="NAME=VALUE",
                        help="environment variable for the training processes (repeatable)")
        sp.add_argument("--skip-fit-check", action="store_true",
                        help="start without compiling the step for the slice here first")
        sp.add_argument("--sync-logs-every", type=int, default=60,
                        help="seconds between copies of each worker's log to the workdir")

    sp = sub.add_parser("create", parents=[common], help="create a TPU VM or pod slice "
                        "(queued: waits until ACTIVE)")
    create_opts(sp)
    sp = sub.add_parser("setup", parents=[common], help="install Python 3.12 + t5lite on every "
                                                        "worker")
    setup_opts(sp)
    sp = sub.add_parser("train", parents=[common], help="run `t5lite train` on every worker "
                        "(attaches to the same job if it already runs)")
    train_opts(sp)
    sp.add_argument("--detach", action="store_true",
                    help="start training and return; follow it with `logs`")
    sp = sub.add_parser("supervise", parents=[common], help="create/setup/train, and again "
                        "after each preemption, until the run's last step")
    create_opts(sp)
    setup_opts(sp)
    train_opts(sp)
    sp.set_defaults(wait_timeout=0)  # spot capacity can take hours to come back
    sp.add_argument("--max-restarts", type=int, default=20)
    sp.add_argument("--backoff", type=float, default=60,
                    help="seconds before the first restart, doubled each time")
    sp.add_argument("--max-backoff", type=float, default=1800)

    sp = sub.add_parser("logs", parents=[common], help="show a worker's training log")
    sp.add_argument("--worker", default="0", help="worker index or 'all' (default: 0)")
    sp.add_argument("--lines", type=int, default=100)
    sp.add_argument("--follow", action=argparse.BooleanOptionalAction, default=True)
    sp.add_argument("--workdir", default="",
                    help="gs://... of the run: read the copies there when the VM is gone")
    sp.add_argument("--sync", action="store_true",
                    help="copy every worker's log to the workdir now")

    grace = dict(type=int, default=180, help="seconds for the job to save a checkpoint")
    sp = sub.add_parser("stop-job", parents=[common],
                        help="stop training on every worker; the VM KEEPS RUNNING (and billing)")
    sp.add_argument("--grace", **grace)
    sp = sub.add_parser("stop-vm", parents=[common], help="stop the job and the TPU VM "
                        "(billing stops; single-host, non-queued VMs)")
    sp.add_argument("--grace", **grace)
    sub.add_parser("start-vm", parents=[common], help="start a stopped TPU VM")
    sub.add_parser("status", parents=[common], help="describe the TPU VM / queued resource")
    sp = sub.add_parser("delete", parents=[common], help="stop the job (checkpoint saved), then "
                        "delete the TPU VM / queued resource: billing stops")
    sp.add_argument("--grace", **grace)
    sp.add_argument("--no-stop-job", action="store_true",
                    help="delete at once, without letting a running job save first")
    sub.add_parser("stop", parents=[common], help="(ambiguous: use stop-job or delete)")
    return p


VERBS = {"create": lambda c, a: create(c, a) or 0, "setup": lambda c, a: setup(c, a) or 0,
         "train": train, "supervise": supervise, "logs": logs, "stop-job": stop_job,
         "stop-vm": stop_vm, "start-vm": start_vm, "status": status, "delete": delete,
         "stop": stop_ambiguous}


def main(argv=None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.accelerator_type:
            st = parse_accelerator_type(args.accelerator_type)
            note(f"{st.accelerator_type}: {st.hosts} host(s); every host runs the same command")
        rc = VERBS[args.subcommand](Cloud(args), args)
        if args.subcommand == "create" and not args.dry_run:
            note(f"{args.name} is ready (and billing). Next: {verb_line(args, 'setup')}")
        return rc
    except LaunchError as e:
        print(f"tpu_vm.py: error: {e}", file=sys.stderr)
        return 2
    except CloudError as e:
        print(f"tpu_vm.py: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if args.subcommand in ("train", "supervise") and not args.dry_run:
            note(f"interrupted: a started job keeps running on the workers; "
                 f"{verb_line(args, 'train')} ... attaches again, `stop-job` stops it.")
        return 130


if __name__ == "__main__":
    sys.exit(main())
