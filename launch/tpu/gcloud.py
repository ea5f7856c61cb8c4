"""The gcloud command runner for one named TPU: builds `gcloud compute tpus ...` commands, runs
them (or prints them in a dry run), and reads `describe`. Also the ssh-agent check that
`--worker=all` needs."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from typing import Callable

from .messages import CloudError, LaunchError
from .slices import parse_accelerator_type


@dataclasses.dataclass
class Node:
    """What `describe` says about the TPU VM(s)."""

    state: str
    accelerator_type: str
    workers: int


TAIL_LINES = 40  # what is kept of a command's output for the error message (and its kind)
MARK_LINES = 10_000  # the launcher's own report lines kept from a stream (a few per worker)
MARKS = ("t5lite-job: ", "t5lite-setup: ")


def _not_installed(cmd: list[str]) -> LaunchError:
    return LaunchError(f"{cmd[0]!r} not found; install the Google Cloud CLI "
                       "(https://cloud.google.com/sdk) or use --dry-run.")


class Cloud:
    """Runs (or, with --dry-run, prints) gcloud commands for one named TPU."""

    def __init__(self, args):
        self.args, self.name, self.dry = args, args.name, args.dry_run
        self.last_error = ""  # the last command's stderr tail
        self.ended_by = ""  # why stream() ended its command ('' when it ended by itself)

    def where(self) -> list[str]:
        """--zone / --project (omitted = gcloud's configured default)."""
        a = self.args
        return ([f"--zone={a.zone}"] if a.zone else []) + (
            [f"--project={a.project}"] if a.project else [])

    def conn(self, tool: str = "") -> list[str]:
        """How ssh/scp reach the workers (internal IPs, IAP); with `tool` ("ssh" / "scp") also
        its keepalive: without one, a host that dies silently (no FIN, no RST) leaves the
        connection, and the launcher waiting on it, open for hours."""
        a = self.args
        route = ["--internal-ip"] * a.internal_ip + ["--tunnel-through-iap"] * a.tunnel_through_iap
        if not tool or not a.ssh_alive_interval:
            return route
        return route + [f"--{tool}-flag=-oServerAliveInterval={a.ssh_alive_interval}",
                        f"--{tool}-flag=-oServerAliveCountMax={a.ssh_alive_count}"]

    def tpu(self, *words) -> list[str]:
        return ["gcloud", "compute", "tpus", *words]

    def tpu_conn(self, *words) -> list[str]:
        """ssh / scp: `tpu-vm ssh --tunnel-through-iap` exists only in `gcloud alpha`."""
        alpha = ["alpha"] * self.args.tunnel_through_iap
        return ["gcloud", *alpha, "compute", "tpus", *words]

    def ssh_cmd(self, remote: str, worker="all") -> list[str]:
        return (self.tpu_conn("tpu-vm", "ssh", self.name, f"--worker={worker}") + self.where()
                + self.conn("ssh") + ["--command", remote])

    def scp_cmd(self, src: str, dst: str) -> list[str]:
        """Copy a local file to `dst` (relative to the home directory) on every worker."""
        return (self.tpu_conn("tpu-vm", "scp", src, f"{self.name}:{dst}", "--worker=all")
                + self.where() + self.conn("scp"))

    def run(self, cmd: list[str]) -> int:
        """Run with stdout passed through and stderr echoed as it comes; gcloud's last stderr
        lines stay in self.last_error (for the error message and whether to retry)."""
        if self.dry:
            print(shlex.join(cmd), flush=True)
            return 0
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        tail = collections.deque(maxlen=TAIL_LINES)
        p = self._popen(cmd, stderr=subprocess.PIPE)
        reader = threading.Thread(target=_echo, args=(p.stderr, sys.stderr, tail), daemon=True)
        reader.start()
        rc = _wait(p)
        reader.join()
        self.last_error = "\n".join(tail)
        return rc

    def check(self, cmd: list[str], what: str) -> None:
        rc = self.run(cmd)
        if rc != 0:
            raise CloudError(f"{what} failed (exit {rc}): {last_lines(self.last_error)}")

    def query(self, cmd: list[str], stdin: str | None = None) -> tuple[int, str, str]:
        assert not self.dry, cmd
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, input=stdin)
        except FileNotFoundError:
            raise _not_installed(cmd) from None
        return r.returncode, r.stdout, r.stderr

    def stream(self, cmd: list[str], watch: Callable[[], str] | None = None,
               every: float = 30) -> tuple[int, list[str]]:
        """Run, echo its output as it comes, and return (exit code, the launcher's report lines:
        `t5lite-job: ...` / `t5lite-setup: ...`). Memory stays bounded however long the job
        runs: only those lines and a short tail (self.last_error) are kept. `watch` is called
        every `every` seconds while it runs; when it returns a reason the command is ended
        (self.ended_by says why) instead of waiting on a connection to a host that is gone."""
        self.ended_by = ""
        if self.dry:
            return self.run(cmd), []
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        marks = collections.deque(maxlen=MARK_LINES)
        tail = collections.deque(maxlen=TAIL_LINES)
        p = self._popen(cmd, stderr=subprocess.STDOUT)
        reader = threading.Thread(target=_echo, args=(p.stdout, sys.stdout, tail, marks),
                                  daemon=True)
        reader.start()
        rc = None
        while rc is None:
            rc = _wait(p, timeout=every if watch else None)
            if rc is None:
                self.ended_by = watch()
                if self.ended_by:
                    rc = _end(p)
        # a process that outlived gcloud may hold the pipe open: its lines are not needed then
        reader.join(timeout=10 if self.ended_by else None)
        self.last_error = "\n".join(tail)
        return rc, list(marks)

    def _popen(self, cmd: list[str], stderr) -> subprocess.Popen:
        try:
            return subprocess.Popen(cmd, stdout=subprocess.PIPE if stderr is subprocess.STDOUT
                                    else None, stderr=stderr, text=True, bufsize=1,
                                    errors="replace", start_new_session=not _interactive())
        except FileNotFoundError:
            raise _not_installed(cmd) from None

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


def _interactive() -> bool:
    """At a terminal ssh may ask for a passphrase on it, which needs the launcher's session;
    elsewhere gcloud gets a session of its own, so that ending it ends its ssh children too."""
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def last_lines(text: str, n: int = 3) -> str:
    """gcloud's last few non-empty stderr lines, on one line (for a one-line error)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) or "no message"


def _echo(src, dst, tail, marks=None) -> None:
    for line in src:
        dst.write(line)
        dst.flush()
        line = line.rstrip("\n")
        tail.append(line)
        if marks is not None and any(m in line for m in MARKS):
            marks.append(line)


def _wait(p: subprocess.Popen, timeout: float | None = None) -> int | None:
    """p's exit code; None after `timeout`. Ctrl-C ends p (and its ssh children) first."""
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    except KeyboardInterrupt:
        _end(p)
        raise


def _descendants(pid: int) -> list[int]:
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return []
    children = [int(c) for c in out.split()]
    return children + [d for c in children for d in _descendants(c)]


def _end(p: subprocess.Popen) -> int:
    """End p and its children (gcloud's ssh processes): SIGTERM, then SIGKILL after 10 s."""
    try:
        own_group = os.getpgid(p.pid) == p.pid
    except ProcessLookupError:
        own_group = False
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            if own_group:
                os.killpg(p.pid, sig)
            else:
                for pid in [*_descendants(p.pid), p.pid]:
                    os.kill(pid, sig)
        except ProcessLookupError:
            pass
        try:
            return p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return p.wait()


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
