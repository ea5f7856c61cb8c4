"""Put the code on every worker and install Python + t5lite there (`setup`)."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile

from .data_ship import dataset_names, pack_and_copy, unpack_line
from .gcloud import Cloud, Node, check_ssh_agent
from .layout import JOB, PYTHON_VERSION, REMOTE_DIR, REPO_ROOT, SETUP_MARK, VENV, VENV_PYTHON
from .messages import CloudError, LaunchError, note
from .vm import require_node

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
            unpack_code_line())


def unpack_code_line() -> str:
    """The worker's part of shipping this checkout: its archive, unpacked in place of the last."""
    return (f"rm -rf {REMOTE_DIR} && mkdir -p {REMOTE_DIR} && "
            f"tar -xzf ~/t5lite-src.tar.gz -C {REMOTE_DIR}")


def setup_script(fetch: str, data: str = "", python: str = PYTHON_VERSION) -> str:
    """What every worker runs: the code (fetch), uv, a venv with `python` and t5lite[tpu] in
    it, and `data` (data_ship.unpack_line, when data was copied). No `t5lite data prepare`:
    building data needs pip in the venv, npm and apt lists (data_ship.py)."""
    want = tuple(int(p) for p in python.split("."))
    steps = [
        # never pull the code from under a running job
        f"if [ -n \"$({JOB} status 2>/dev/null | grep ' running ')\" ]; then echo "
        "'t5lite-setup: a job is running on this worker: stop-job first' >&2; exit 3; fi",
        fetch, f"cd {REMOTE_DIR}",
        "(python3 -m pip install --user --quiet --upgrade uv || python3 -m pip install --user "
        "--quiet --upgrade --break-system-packages uv)",
        f"({VENV_PYTHON} -c 'import sys; assert sys.version_info[:{len(want)}] == {want}' "
        f"2>/dev/null || (rm -rf {VENV} && python3 -m uv venv --python {python} {VENV}))",
        f"python3 -m uv pip install --python {VENV_PYTHON} -e '.[tpu]'",
    ]
    if data:
        steps.append(data)
    steps += [f"date -u > {SETUP_MARK}", "echo t5lite-setup: ok"]
    return "set -e; " + " && ".join(steps)


def setup(cloud: Cloud, args, node: Node | None = None) -> None:
    if getattr(args, "prepare_data", None):
        raise LaunchError("--prepare-data is gone: TPU workers cannot build data (no pip in "
                          "the venv, no npm, no apt lists); --data=NAME,... builds it here and "
                          "copies it to every worker.")
    node = node or require_node(cloud, args)
    check_ssh_agent(0 if cloud.dry else node.workers)
    names = dataset_names(getattr(args, "data", None))
    if names:  # first: a dataset that cannot be built here stops setup before any copy
        pack_and_copy(cloud, args, names)
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
    script = setup_script(fetch, unpack_line() if names else "",
                          getattr(args, "python_version", PYTHON_VERSION))
    rc, lines = cloud.stream(cloud.ssh_cmd(script))
    ok = sum(line.strip() == "t5lite-setup: ok" for line in lines)
    if not cloud.dry and (rc != 0 or ok < node.workers):
        raise CloudError(f"setup failed on {node.workers - ok} of {node.workers} worker(s) "
                         "(output above); fix it and run setup again.")


def setup_done(cloud: Cloud, node: Node) -> bool:
    rc, lines = cloud.stream(cloud.ssh_cmd(
        f"test -f {SETUP_MARK} && test -f {REMOTE_DIR}/launch/tpu_job.sh && "
        "echo t5lite-setup: ok || echo t5lite-setup: missing"))
    return sum(line.strip() == "t5lite-setup: ok" for line in lines) >= node.workers
