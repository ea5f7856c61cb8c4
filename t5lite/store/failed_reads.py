"""asyncio's records of checkpoint reads that already failed, dropped whenever they come.

orbax reads a step's shards concurrently and raises the first failure; the other failed reads
end in tasks nobody awaits, and some are freed only later (their last reference held by a read
still in flight): asyncio then logs each with its traceback ("Task exception was never
retrieved") mid-training or at exit, after progress.quiet_failed_reads' block has ended. The
checkpointer reports a step it found unreadable in one line; these records add nothing.
"""

from __future__ import annotations

import logging


class _ReportedReads(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" records of reads from the
    checkpoint dirs in `dirs` (named in the read error, a cause of orbax's exception)."""

    def __init__(self):
        super().__init__()
        self.dirs = set()

    def filter(self, record):
        if "exception was never retrieved" not in record.getMessage():
            return True
        exc, seen = record.exc_info[1] if record.exc_info else None, []
        while exc is not None and len(seen) < 8:  # the read error is a cause of orbax's
            seen.append(str(exc))
            exc = exc.__cause__ or exc.__context__
        return not any(d in text for text in seen for d in self.dirs)


_filter = _ReportedReads()


def reported(path: str) -> None:
    """The failed reads of `path` (a step or params dir) were reported: asyncio's records of
    them are noise from now on, whenever their tasks are freed."""
    if not _filter.dirs:
        logging.getLogger("asyncio").addFilter(_filter)
    _filter.dirs.add(path.rstrip("/") + "/")
