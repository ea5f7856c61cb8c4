"""Create, set up, train on, supervise and delete a Cloud TPU VM or pod slice with `gcloud`.

The argument parser (one builder per subcommand) and main(), which maps LaunchError to exit 2
and CloudError to exit 1; every other exit code is the verb's (for train: the job's).
"""

from __future__ import annotations

import argparse
import sys

from .data_ship import ship_data
from .gcloud import Cloud
from .job import logs, stop_job, train
from .layout import PYTHON_VERSION
from .messages import CloudError, LaunchError, note, verb_line
from .slices import parse_accelerator_type
from .supervise import supervise
from .vm import create, delete, start_vm, status, stop_ambiguous, stop_vm
from .worker_setup import setup

GRACE = dict(type=int, default=180, help="seconds for the job to save a checkpoint")


def common_parser() -> argparse.ArgumentParser:
    """The TPU's name, where it is, how to reach it, and --dry-run: every verb takes them."""
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
                        help="connect (ssh/scp) to the workers' internal IPs: from a machine "
                             "inside the VPC; not with --tunnel-through-iap")
    common.add_argument("--tunnel-through-iap", action="store_true",
                        help="ssh/scp through Identity-Aware Proxy (VMs without external IPs, "
                             "from outside the VPC); runs `gcloud alpha` (gcloud components "
                             "install alpha)")
    common.add_argument("--ssh-alive-interval", type=int, default=30, metavar="SECONDS",
                        help="ssh keepalive (ServerAliveInterval): a silently dead host ends "
                             "the connection after SECONDS x --ssh-alive-count (0: off)")
    common.add_argument("--ssh-alive-count", type=int, default=4,
                        help="unanswered keepalives before ssh gives up (ServerAliveCountMax)")
    common.add_argument("--dry-run", action="store_true",
                        help="print the gcloud commands, one per line, and run nothing")
    return common


def add_create_options(sp) -> None:
    sp.add_argument("--runtime-version", default="",
                    help="default per generation (v4: tpu-ubuntu2204-base, v5p: "
                         "v2-alpha-tpuv5, v5litepod: v2-alpha-tpuv5-lite, "
                         "v6e: v2-alpha-tpuv6e)")
    sp.add_argument("--spot", action="store_true", help="Spot VMs (preemptible, cheaper)")
    sp.add_argument("--best-effort", action="store_true",
                    help="queued only: best-effort quota; runs `gcloud alpha` (needs the alpha "
                         "component: gcloud components install alpha)")
    sp.add_argument("--reserved", action="store_true", help="use reserved capacity")
    sp.add_argument("--no-external-ip", action="store_true",
                    help="create the VMs without external IPs (gcloud --internal-ips). They "
                         "then reach PyPI and other registries (setup) only through Cloud NAT "
                         "on their subnet; connect with --internal-ip or --tunnel-through-iap")
    for flag, what in [("network", "VPC network"), ("subnetwork", "subnetwork"),
                       ("service-account", "service account email for the VMs"),
                       ("scopes", "access scopes, comma-separated"),
                       ("metadata", "KEY=VALUE,... VM metadata")]:
        sp.add_argument(f"--{flag}", default="", help=f"{what} (gcloud --{flag})")
    sp.add_argument("--wait-timeout", type=float, default=3600,
                    help="queued: seconds to wait for ACTIVE (0 = no limit; create: "
                         "3600, supervise: no limit)")
    sp.add_argument("--poll-seconds", type=float, default=30,
                    help="seconds between state checks (queued resource; slice while a "
                         "job runs)")


def add_setup_options(sp) -> None:
    sp.add_argument("--repo", default="", help="git URL to clone (default: ship this "
                                               "checkout's HEAD with git archive + scp)")
    sp.add_argument("--branch", default="", help="with --repo: branch or tag")
    sp.add_argument("--data", action="append", metavar="NAME,...",
                    help="datasets (`t5lite data prepare` names, e.g. quickstart, vocab_t5) to "
                         "build here and copy to every worker's ~/.cache/t5lite (workers "
                         "cannot build them); `data` copies more later")
    sp.add_argument("--python-version", default=PYTHON_VERSION,
                    help=f"Python of the workers' venv (uv downloads it; default "
                         f"{PYTHON_VERSION})")
    # workers never build data now: --no-prepare-data is accepted (scripts pass it), a plain
    # --prepare-data says what replaced it
    sp.add_argument("--prepare-data", action=argparse.BooleanOptionalAction, default=None,
                    help=argparse.SUPPRESS)


def add_data_verb(sub, common) -> None:
    sp = sub.add_parser("data", parents=[common], help="build datasets here and copy them to "
                        "every worker (they cannot build them: no npm, no apt lists)")
    sp.add_argument("datasets", nargs="+", metavar="DATASET",
                    help="`t5lite data prepare` names (quickstart, corpus, vocab_t5, ...)")


def add_train_options(sp) -> None:
    sp.add_argument("--config", required=True, help="configs/NAME.py (path inside the repo)")
    sp.add_argument("--workdir", required=True, help="gs://BUCKET/PATH for checkpoints; "
                                                     "worker logs go to WORKDIR/worker_logs/")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override")
    sp.add_argument("--env", action="append", metavar="NAME=VALUE",
                    help="environment variable for the training processes (repeatable). "
                         "Values are never printed, logged or put on a command line: they "
                         "reach the workers in a file readable only by you (names are shown)")
    sp.add_argument("--skip-bucket-check", action="store_true",
                    help="do not check first that the workdir's bucket exists and is writable")
    sp.add_argument("--skip-fit-check", action="store_true",
                    help="start without compiling the step for the slice here first")
    sp.add_argument("--sync-logs-every", type=int, default=60,
                    help="seconds between copies of each worker's log to the workdir")


def add_run_verbs(sub, common) -> None:
    """create, setup, train and supervise."""
    sp = sub.add_parser("create", parents=[common], help="create a TPU VM or pod slice "
                        "(queued: waits until ACTIVE)")
    add_create_options(sp)
    sp = sub.add_parser("setup", parents=[common], help="install Python 3.12 + t5lite on every "
                                                        "worker (--data: and datasets)")
    add_setup_options(sp)
    sp = sub.add_parser("train", parents=[common], help="run `t5lite train` on every worker "
                        "(attaches to the same job if it already runs)")
    add_train_options(sp)
    sp.add_argument("--detach", action="store_true",
                    help="start training and return; follow it with `logs`")
    sp.add_argument("--poll-seconds", type=float, default=30,
                    help="seconds between checks that the slice is still READY while the "
                         "job runs")
    sp = sub.add_parser("supervise", parents=[common], help="create/setup/train, and again "
                        "after each preemption, until the run's last step")
    add_create_options(sp)
    add_setup_options(sp)
    add_train_options(sp)
    sp.set_defaults(wait_timeout=0)  # spot capacity can take hours to come back
    sp.add_argument("--max-restarts", type=int, default=20,
                    help="job restarts (after preemptions, lost slices) before giving up")
    sp.add_argument("--retries", type=int, default=10,
                    help="tries of a failing create / setup / copy / ssh before giving up "
                         "(a permanent error: bad flag, quota, permission: 3)")
    sp.add_argument("--backoff", type=float, default=60,
                    help="seconds before the first retry or restart, doubled each time, "
                         "jittered")
    sp.add_argument("--max-backoff", type=float, default=1800)


def add_watch_and_stop_verbs(sub, common) -> None:
    """logs, stop-job, stop-vm, start-vm, status, delete, and the ambiguous stop."""
    sp = sub.add_parser("logs", parents=[common], help="show a worker's training log")
    sp.add_argument("--worker", default="0", help="worker index or 'all' (default: 0)")
    sp.add_argument("--lines", type=int, default=100)
    sp.add_argument("--follow", action=argparse.BooleanOptionalAction, default=True)
    sp.add_argument("--workdir", default="",
                    help="gs://... of the run: read the copies there when the VM is gone")
    sp.add_argument("--sync", action="store_true",
                    help="copy every worker's log to the workdir now")
    sp = sub.add_parser("stop-job", parents=[common],
                        help="stop training on every worker; the VM KEEPS RUNNING (and billing)")
    sp.add_argument("--grace", **GRACE)
    sp = sub.add_parser("stop-vm", parents=[common], help="stop the job and the TPU VM "
                        "(billing stops; single-host, non-queued VMs)")
    sp.add_argument("--grace", **GRACE)
    sub.add_parser("start-vm", parents=[common], help="start a stopped TPU VM")
    sub.add_parser("status", parents=[common], help="describe the TPU VM / queued resource")
    sp = sub.add_parser("delete", parents=[common], help="stop the job (checkpoint saved), then "
                        "delete the TPU VM / queued resource: billing stops")
    sp.add_argument("--grace", **GRACE)
    sp.add_argument("--no-stop-job", action="store_true",
                    help="delete at once, without letting a running job save first")
    sub.add_parser("stop", parents=[common], help="(ambiguous: use stop-job or delete)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tpu_vm.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Billing: `stop-job` stops training only (the VM keeps "
                                       "running and billing); `delete` stops billing (`stop-vm` "
                                       "too, for single-host TPU VMs).")
    common = common_parser()
    sub = p.add_subparsers(dest="subcommand", required=True)
    add_run_verbs(sub, common)
    add_data_verb(sub, common)
    add_watch_and_stop_verbs(sub, common)
    return p


VERBS = {"create": lambda c, a: create(c, a) or 0, "setup": lambda c, a: setup(c, a) or 0,
         "data": ship_data,
         "train": train, "supervise": supervise, "logs": logs, "stop-job": stop_job,
         "stop-vm": stop_vm, "start-vm": start_vm, "status": status, "delete": delete,
         "stop": stop_ambiguous}


def check_routes(args) -> None:
    """Refuse, before anything is rented, what gcloud or the network would refuse later."""
    if args.internal_ip and args.tunnel_through_iap:
        raise LaunchError("--internal-ip and --tunnel-through-iap exclude each other (gcloud "
                          "refuses both): --internal-ip from a machine inside the VPC, "
                          "--tunnel-through-iap from outside it.")
    if getattr(args, "no_external_ip", False) and not (
            args.internal_ip or args.tunnel_through_iap):
        fix = ("add --internal-ip (this machine is in the VPC) or --tunnel-through-iap "
               "(from outside it)")
        if args.subcommand == "supervise":
            raise LaunchError(f"--no-external-ip: VMs without external IPs cannot be reached "
                              f"over their external IP: {fix}.")
        note("--no-external-ip: later verbs need --internal-ip or --tunnel-through-iap; the "
             "VMs reach registries (setup) only through Cloud NAT")


def main(argv=None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_routes(args)
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
