"""asyncio's records of checkpoint reads that already failed, dropped whenever they come.

orbax reads a step's shards concurrently and raises the first failure; the other failed reads
end in tasks nobody awaits, and some are freed only later (their last reference held by a read
still in flight): asyncio then logs each with its traceback ("Task exception was never
retrieved") mid-training or at exit, after progress.quiet_failed_reads' block has ended, and
reads still pending when their loop closed end as unraisable errors. The checkpointer reports
a step it found unreadable in one line; these add nothing.
"""

from __future__ import annotations

import logging
import sys


class _ReportedReads(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" records of reads from the
    checkpoint dirs in `dirs` (named in the read error or one of its causes)."""

    def __init__(self):
        super().__init__()
        self.dirs = set()

    def mentions(self, exc) -> bool:
        for _ in range(8):  # orbax's exception, then its causes (TensorStore's error)
            if exc is None:
                return False
            if any(d in str(exc) for d in self.dirs):
                return True
            exc = exc.__cause__ or exc.__context__
        return False

    def filter(self, record):
        if "exception was never retrieved" not in record.getMessage():
            return True
        return not self.mentions(record.exc_info[1] if record.exc_info else None)


_filter = _ReportedReads()


def _unraisable_hook(previous):
    """sys.unraisablehook that drops the reads still pending when their event loop closed:
    a coroutine freed mid-read turns GeneratorExit into orbax's read error ("Exception
    ignored in: <coroutine object _read_array_index_and_device_put>")."""
    def hook(unraisable):
        if not _filter.mentions(unraisable.exc_value):
            previous(unraisable)
    hook.drops_failed_reads = True
    return hook


def reported(path: str) -> None:
    """The failed reads of `path` (a step or params dir) were reported: asyncio's records and
    the unraisable errors of them are noise from now on, whenever their tasks are freed."""
    if not _filter.dirs:
        logging.getLogger("asyncio").addFilter(_filter)
    _filter.dirs.add(path.rstrip("/") + "/")
    if not getattr(sys.unraisablehook, "drops_failed_reads", False):
        sys.unraisablehook = _unraisable_hook(sys.unraisablehook)
