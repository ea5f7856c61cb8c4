"""The stop marker: `stop-job`, `stop-vm` and `delete` leave one on this machine, and a
`supervise` of the same TPU that sees it stops instead of restarting the job or recreating the
slice (a job that exits 75 after a stop was stopped, not preempted).

The workers keep their own mark (launch/tpu_job.sh `stop`), which covers a stop typed on
another machine; a slice deleted from another machine is gone rather than preempted, which
`supervise` also takes as a stop.
"""

from __future__ import annotations

import datetime
import json
import os
import re


class Stopped(Exception):
    """A stop was asked for (or the slice was deleted): supervise ends without restarting."""


def marker_path(args) -> str:
    """One per TPU name: `stop-job NAME` typed without the --zone / --project that supervise
    was given (gcloud's defaults) must still reach it."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "t5lite-tpu", re.sub(r"[^A-Za-z0-9.-]", "-", args.name) + ".stop")


def mark_stopped(args, verb: str) -> None:
    path = marker_path(args)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with open(path, "w") as f:
        json.dump({"verb": verb, "time": when}, f)


def stop_requested(args) -> str:
    """'' or what asked for the stop ("stop-job at 2026-...")."""
    try:
        with open(marker_path(args)) as f:
            mark = json.load(f)
    except (OSError, ValueError):
        return ""
    return f"{mark.get('verb', 'a stop')} at {mark.get('time', '?')}"


def clear_stop(args) -> str:
    """Remove an earlier stop (a new `supervise` means: run). Returns what it was."""
    was = stop_requested(args)
    try:
        os.remove(marker_path(args))
    except FileNotFoundError:
        pass
    return was
