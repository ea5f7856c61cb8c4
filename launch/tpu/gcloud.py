"""The gcloud command runner for one named TPU: builds `gcloud compute tpus ...` commands, runs
them (or prints them in a dry run), and reads `describe`. Also the ssh-agent check that
`--worker=all` needs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

from .messages import CloudError, LaunchError
from .slices import parse_accelerator_type


@dataclasses.dataclass
class Node:
    """What `describe` says about the TPU VM(s)."""

    state: str
    accelerator_type: str
    workers: int


def _not_installed(cmd: list[str]) -> LaunchError:
    return LaunchError(f"{cmd[0]!r} not found; install the Google Cloud CLI "
                       "(https://cloud.google.com/sdk) or use --dry-run.")


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
            raise _not_installed(cmd) from None

    def check(self, cmd: list[str], what: str) -> None:
        rc = self.run(cmd)
        if rc != 0:
            raise CloudError(f"{what} failed (exit {rc}); gcloud's message is above.")

    def query(self, cmd: list[str]) -> tuple[int, str, str]:
        assert not self.dry, cmd
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            raise _not_installed(cmd) from None
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
            raise _not_installed(cmd) from None
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
