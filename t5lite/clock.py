"""When this `t5lite` command started, for the wall clock a user waits through (goodput's
start-up, the quickstart's total): the command's own start, marked by the CLI as it is imported,
not its process's. A shell that runs `pip install ... && t5lite quickstart` execs t5lite in its
own process, whose start (/proc) is the shell's: the install would count as t5lite's time."""

from __future__ import annotations

from typing import Optional

_start: list = []


def mark_command_start(at: float) -> None:
    """The CLI's first moment (once per process; a later call changes nothing)."""
    if not _start:
        _start.append(at)


def command_start() -> Optional[float]:
    """The marked start, or None for a process that is not the `t5lite` command (Python)."""
    return _start[0] if _start else None
