#!/usr/bin/env python3
"""Create, set up, train on, and delete a Cloud TPU VM or pod slice with `gcloud`.

Every subcommand builds plain `gcloud compute tpus ...` command lines and runs them in order,
stopping at the first failure; `--dry-run` prints them instead (one per line, shell-quoted,
exactly as they would run). Standard library only, so it runs on any laptop with gcloud.

    python launch/tpu_vm.py create my-tpu --zone=us-central2-b --accelerator-type=v4-8
    python launch/tpu_vm.py setup  my-tpu --zone=us-central2-b
    python launch/tpu_vm.py train  my-tpu --zone=us-central2-b \\
        --config=configs/t5_1_1_small.py --workdir=gs://my-bucket/runs/small
    python launch/tpu_vm.py delete my-tpu --zone=us-central2-b

On a pod slice (more than one host) every command that touches the VMs runs on all workers at
once (`--worker=all`): each host runs the same `t5lite train`, and jax.distributed.initialize()
finds the other hosts by itself (mesh.multihost=true).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOTE_DIR = "~/t5lite"  # where the code lives on every worker
LOG_FILE = "~/t5lite-train.log"  # each worker's training output (the `logs` subcommand reads it)
PID_FILE = "~/t5lite-train.pid"  # the training process, for `stop`


class LaunchError(Exception):
    """A mistake in the launcher's arguments; the message says what to do.

    (Not t5lite.errors.UserError: this script runs where t5lite may not be installed.)
    """


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


# ----------------------------------------------------------------------------- commands


def _where(args) -> list[str]:
    """--zone / --project flags shared by every gcloud command (omitted = gcloud's default)."""
    out = []
    if args.zone:
        out.append(f"--zone={args.zone}")
    if args.project:
        out.append(f"--project={args.project}")
    return out


def ssh(args, remote: str, worker: str = "all") -> list[str]:
    return (["gcloud", "compute", "tpus", "tpu-vm", "ssh", args.name, f"--worker={worker}"]
            + _where(args) + ["--command", remote])


def create_commands(args) -> list[list[str]]:
    st = parse_accelerator_type(args.accelerator_type)
    runtime = args.runtime_version or st.runtime
    if args.queued:
        gcloud = ["gcloud", "alpha"] if args.best_effort else ["gcloud"]
        cmd = gcloud + ["compute", "tpus", "queued-resources", "create", args.name,
                        f"--node-id={args.name}", f"--accelerator-type={st.accelerator_type}",
                        f"--runtime-version={runtime}"] + _where(args)
        cmd += ["--spot"] * args.spot + ["--best-effort"] * args.best_effort
        cmd += ["--reserved"] * args.reserved
    else:
        if args.best_effort:
            raise LaunchError("--best-effort exists only for queued resources; add --queued.")
        cmd = ["gcloud", "compute", "tpus", "tpu-vm", "create", args.name,
               f"--accelerator-type={st.accelerator_type}", f"--version={runtime}"]
        cmd += _where(args) + ["--spot"] * args.spot + ["--reserved"] * args.reserved
    return [cmd]


def setup_commands(args) -> list[list[str]]:
    """Put the code on every worker, then `pip install -e .[tpu]` there."""
    cmds = []
    if args.repo:
        branch = f"--branch {shlex.quote(args.branch)} " if args.branch else ""
        fetch = (f"rm -rf {REMOTE_DIR} && git clone --depth 1 {branch}"
                 f"{shlex.quote(args.repo)} {REMOTE_DIR}")
    else:  # ship this checkout's HEAD (committed files only) to every worker
        archive = os.path.join(tempfile.gettempdir(), f"t5lite-src-{args.name}.tar.gz")
        cmds.append(["git", "-C", REPO_ROOT, "archive", "--format=tar.gz",
                     f"--output={archive}", "HEAD"])
        cmds.append(["gcloud", "compute", "tpus", "tpu-vm", "scp", archive,
                     f"{args.name}:t5lite-src.tar.gz", "--worker=all"] + _where(args))
        fetch = (f"rm -rf {REMOTE_DIR} && mkdir -p {REMOTE_DIR} && "
                 f"tar -xzf ~/t5lite-src.tar.gz -C {REMOTE_DIR}")
    steps = [fetch, f"cd {REMOTE_DIR}", "python3 -m pip install --upgrade pip",
             'python3 -m pip install -e ".[tpu]"']
    if args.prepare_data:
        steps.append("python3 -m t5lite.cli data prepare")
    cmds.append(ssh(args, "set -e; " + " && ".join(steps)))
    return cmds


def train_command_line(args) -> str:
    """The `t5lite train` invocation every worker runs (identical on all hosts)."""
    if not args.workdir.startswith("gs://"):
        raise LaunchError(f"--workdir={args.workdir!r}: use a GCS path (gs://BUCKET/PATH). "
                          "All hosts must write one checkpoint together, and a TPU VM's disk "
                          "is deleted with the VM.")
    if args.accelerator_type:
        parse_accelerator_type(args.accelerator_type)  # validate early
    cmd = ["t5lite", "train", f"--config={args.config}", f"--workdir={args.workdir}",
           "--set", "mesh.multihost=true"]
    for item in args.set or []:
        cmd += ["--set", item]
    return shlex.join(cmd)


def train_commands(args) -> list[list[str]]:
    exports = []
    for item in args.env or []:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise LaunchError(f"--env {item!r} must look like NAME=VALUE.")
        exports.append(f"export {key}={shlex.quote(value)}")
    # Start detached (nohup), so a dropped ssh session does not kill training; then follow
    # the log until the process ends and return its exit status.
    setup = [f"cd {REMOTE_DIR} || exit 1", 'export PATH="$HOME/.local/bin:$PATH"', *exports]
    start = f"nohup {train_command_line(args)} > {LOG_FILE} 2>&1 &"
    after = ["pid=$!", f"echo $pid > {PID_FILE}"]
    if not args.detach:
        after += [f"tail --pid=$pid -n +1 -f {LOG_FILE}", "wait $pid"]
    return [ssh(args, "; ".join(setup) + "; " + start + " " + "; ".join(after))]


def logs_commands(args) -> list[list[str]]:
    follow = "-f " if args.follow else ""
    return [ssh(args, f"tail -n {args.lines} {follow}{LOG_FILE}", worker=args.worker)]


def stop_commands(args) -> list[list[str]]:
    return [ssh(args, f"if [ -f {PID_FILE} ]; then kill $(cat {PID_FILE}) 2>/dev/null; "
                      f"rm -f {PID_FILE}; fi; true")]


def status_commands(args) -> list[list[str]]:
    kind = ["queued-resources"] if args.queued else ["tpu-vm"]
    return [["gcloud", "compute", "tpus", *kind, "describe", args.name] + _where(args)]


def delete_commands(args) -> list[list[str]]:
    if args.queued:  # --force also deletes the TPU VM the queued resource created
        return [["gcloud", "compute", "tpus", "queued-resources", "delete", args.name]
                + _where(args) + ["--force", "--quiet"]]
    return [["gcloud", "compute", "tpus", "tpu-vm", "delete", args.name] + _where(args)
            + ["--quiet"]]


COMMANDS = {"create": create_commands, "setup": setup_commands, "train": train_commands,
            "logs": logs_commands, "stop": stop_commands, "status": status_commands,
            "delete": delete_commands}


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tpu_vm.py", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("name", help="TPU VM (and queued resource) name")
    common.add_argument("--zone", default="", help="e.g. us-central2-b (default: gcloud's)")
    common.add_argument("--project", default="", help="GCP project (default: gcloud's)")
    common.add_argument("--accelerator-type", default="",
                        help="v4-8, v5p-32, v5litepod-16, v6e-8 ...; validated, hosts printed")
    common.add_argument("--queued", action="store_true",
                        help="use a queued resource (create/status/delete)")
    common.add_argument("--dry-run", action="store_true",
                        help="print the commands, one per line, and run nothing")
    sub = p.add_subparsers(dest="subcommand", required=True)

    sp = sub.add_parser("create", parents=[common], help="create a TPU VM or pod slice")
    sp.add_argument("--runtime-version", default="",
                    help="default per generation (v4: tpu-ubuntu2204-base, v5p: v2-alpha-tpuv5, "
                         "v5litepod: v2-alpha-tpuv5-lite, v6e: v2-alpha-tpuv6e)")
    sp.add_argument("--spot", action="store_true", help="Spot VMs (preemptible, cheaper)")
    sp.add_argument("--best-effort", action="store_true",
                    help="queued only: best-effort quota (uses `gcloud alpha`)")
    sp.add_argument("--reserved", action="store_true", help="use reserved capacity")

    sp = sub.add_parser("setup", parents=[common], help="install t5lite on every worker")
    sp.add_argument("--repo", default="", help="git URL to clone (default: ship this "
                                               "checkout's HEAD with git archive + scp)")
    sp.add_argument("--branch", default="", help="with --repo: branch or tag")
    sp.add_argument("--prepare-data", action=argparse.BooleanOptionalAction, default=True,
                    help="run `t5lite data prepare` on every worker (default: yes)")

    sp = sub.add_parser("train", parents=[common], help="run `t5lite train` on every worker")
    sp.add_argument("--config", required=True, help="configs/NAME.py (path inside the repo)")
    sp.add_argument("--workdir", required=True, help="gs://BUCKET/PATH for checkpoints, logs")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")
    sp.add_argument("--env", action="append", metavar="NAME=VALUE",
                    help="environment variable for the training processes (repeatable)")
    sp.add_argument("--detach", action="store_true",
                    help="start training and return; follow it with `logs`")

    sp = sub.add_parser("logs", parents=[common], help="show a worker's training log")
    sp.add_argument("--worker", default="0", help="worker index or 'all' (default: 0)")
    sp.add_argument("--lines", type=int, default=100)
    sp.add_argument("--follow", action=argparse.BooleanOptionalAction, default=True)

    sub.add_parser("stop", parents=[common], help="stop training on every worker")
    sub.add_parser("status", parents=[common], help="describe the TPU VM / queued resource")
    sub.add_parser("delete", parents=[common], help="delete the TPU VM / queued resource")
    return p


def plan(argv: list[str]) -> list[list[str]]:
    """The command lines a subcommand would run (raises LaunchError on bad arguments)."""
    return plan_args(build_parser().parse_args(argv))


def plan_args(args) -> list[list[str]]:
    if args.subcommand == "create" and not args.accelerator_type:
        raise LaunchError("create needs --accelerator-type (e.g. v4-8, v5p-32, v5litepod-16).")
    return COMMANDS[args.subcommand](args)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        cmds = plan_args(args)
        if args.accelerator_type:
            st = parse_accelerator_type(args.accelerator_type)
            print(f"# {st.accelerator_type}: {st.hosts} host(s); every host runs the same "
                  f"command", file=sys.stderr)
    except LaunchError as e:
        print(f"tpu_vm.py: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for cmd in cmds:
            print(shlex.join(cmd))
        return 0
    for cmd in cmds:
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        try:
            rc = subprocess.call(cmd)
        except FileNotFoundError:
            print(f"tpu_vm.py: error: {cmd[0]!r} not found; install the Google Cloud CLI "
                  "(https://cloud.google.com/sdk) or use --dry-run.", file=sys.stderr)
            return 127
        except KeyboardInterrupt:
            return 130
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
