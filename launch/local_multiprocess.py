#!/usr/bin/env python3
"""Run one command as N JAX processes on this machine: a multi-host job without the hosts.

    python launch/local_multiprocess.py --num-processes 2 --devices-per-process 4 -- \\
        t5lite train --config configs/quickstart.py --workdir /tmp/run

Each child gets its own simulated CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count,
set in its environment, so before it imports jax) and joins one jax.distributed job through a
coordinator on 127.0.0.1 at a free port. A leading `t5lite train` gets the mesh.* overrides
(multihost, coordinator address, process count and index); any other command reads the same
values from T5LITE_COORDINATOR / T5LITE_NUM_PROCESSES / T5LITE_PROCESS_ID. Output lines are
prefixed with the rank. If one child fails (or on Ctrl-C, or --timeout) the others are killed,
and the exit status is the first failure's. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(base: dict, rank: int, num_processes: int, devices: int, coordinator: str) -> dict:
    """The environment of process `rank`: its own CPU device count and the job's coordinates."""
    env = dict(base)
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags.strip()} --xla_force_host_platform_device_count={devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(T5LITE_COORDINATOR=coordinator, T5LITE_NUM_PROCESSES=str(num_processes),
               T5LITE_PROCESS_ID=str(rank))
    return env


def child_command(command: list[str], rank: int, num_processes: int, coordinator: str):
    """`t5lite train ...` -> `python -m t5lite.cli train ... --set mesh.*=...`; others as given."""
    if command[:1] == ["t5lite"]:
        command = [sys.executable, "-m", "t5lite.cli"] + command[1:]
        if command[3:4] == ["train"]:
            command += ["--set", "mesh.multihost=true",
                        "--set", f"mesh.coordinator_address={coordinator}",
                        "--set", f"mesh.num_processes={num_processes}",
                        "--set", f"mesh.process_id={rank}"]
    return command


def _pump(rank: int, stream, out, lock: threading.Lock):
    for line in iter(stream.readline, b""):
        with lock:
            out.write(f"[{rank}] " + line.decode("utf-8", "replace"))
            out.flush()
    stream.close()


def _kill_all(procs: list[subprocess.Popen], grace_s: float = 5.0):
    """SIGTERM each child's process group, then SIGKILL whatever is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)  # the child's own group (start_new_session=True)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)


def run(command: list[str], num_processes: int, devices_per_process: int, port: int = 0,
        timeout_s: float = 0, out=None) -> int:
    """Start the processes, wait for all; returns 0, or the first failing child's status."""
    out = out or sys.stdout
    coordinator = f"127.0.0.1:{port or free_port()}"
    lock = threading.Lock()
    procs, pumps = [], []
    for rank in range(num_processes):
        cmd = child_command(command, rank, num_processes, coordinator)
        p = subprocess.Popen(cmd, env=child_env(os.environ, rank, num_processes,
                                                devices_per_process, coordinator),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        pumps.append(threading.Thread(target=_pump, args=(rank, p.stdout, out, lock),
                                      daemon=True))
        pumps[-1].start()
    print(f"local_multiprocess: {num_processes} processes x {devices_per_process} CPU devices, "
          f"coordinator {coordinator}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    status = 0
    try:
        while None in [p.poll() for p in procs]:  # a list: poll every child each time
            failed = [p for p in procs if p.returncode not in (None, 0)]
            if failed:
                status = failed[0].returncode
                rank = procs.index(failed[0])
                print(f"local_multiprocess: process {rank} exited with {status}; "
                      "stopping the others", file=sys.stderr, flush=True)
                break
            if deadline and time.monotonic() > deadline:
                print(f"local_multiprocess: timeout after {timeout_s:.0f}s; stopping all",
                      file=sys.stderr, flush=True)
                status = 124
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        status = 130
    finally:
        _kill_all(procs)
        for t in pumps:
            t.join(timeout=5)
    if status == 0:
        status = next((p.returncode for p in procs if p.returncode != 0), 0)
    return status


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="local_multiprocess.py", description=__doc__.splitlines()[0],
                                usage="%(prog)s [options] -- COMMAND ...")
    p.add_argument("--num-processes", "-n", type=int, default=2)
    p.add_argument("--devices-per-process", "-d", type=int, default=4,
                   help="simulated CPU devices in each process")
    p.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
    p.add_argument("--timeout", type=float, default=0, help="seconds; 0 = no limit")
    if "--" in argv:
        split = argv.index("--")
        args, command = p.parse_args(argv[:split]), argv[split + 1:]
    else:
        args, command = p.parse_known_args(argv)
    if not command:
        p.error("give the command after --, e.g. -- t5lite train --config ... --workdir ...")
    if args.num_processes < 1 or args.devices_per_process < 1:
        p.error("--num-processes and --devices-per-process must be at least 1")
    def on_term(signum, frame):  # `kill` of the launcher stops the children too
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    return run(command, args.num_processes, args.devices_per_process, args.port, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
