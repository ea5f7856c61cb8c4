"""Progress bars that suit where the output goes: tqdm's bar on a terminal, plain periodic lines
in a log file (SLURM .out, the TPU launcher's nohup log), so a file never fills with
carriage-return redraws.

`bar(...)` takes tqdm's arguments. Off a terminal it prints a whole line at most every
`$T5LITE_PROGRESS_SECONDS` (default 30) seconds, plus the first and the last.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

from tqdm import tqdm


def _interval() -> float:
    try:
        return float(os.environ.get("T5LITE_PROGRESS_SECONDS", "30"))
    except ValueError:
        return 30.0


def is_tty(file=None) -> bool:
    file = file if file is not None else sys.stderr
    try:
        return file.isatty()
    except (AttributeError, ValueError):
        return False


class LineTqdm(tqdm):
    """tqdm that writes whole lines, at most one per `mininterval` seconds, never '\\r'."""

    def __init__(self, *args, **kwargs):
        self._line_t = None
        self._line = None
        kwargs["mininterval"] = kwargs.get("mininterval") or _interval()
        kwargs["dynamic_ncols"] = False
        kwargs.setdefault("ascii", True)
        total = kwargs.get("total")
        if total is None and args and hasattr(args[0], "__len__"):
            total = len(args[0])
        if "bar_format" not in kwargs:  # no bar glyphs in a log: count, percent, times, rate
            kwargs["bar_format"] = (
                "{desc}: {n_fmt}/{total_fmt} ({percentage:.0f}%) [{elapsed}<{remaining}, "
                "{rate_fmt}{postfix}]" if total else
                "{desc}: {n_fmt} [{elapsed}, {rate_fmt}{postfix}]")
        if kwargs.get("leave") is False:  # a passing bar (eval inside training): only slow
            self._line_t = time.time()  # ones print, from mininterval on
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None, force=False):
        if msg == "":  # tqdm clearing its line: nothing to clear in a log
            return True
        now = time.time()
        if not force and self._line_t is not None and now - self._line_t < self.mininterval:
            return True
        line = self.__str__() if msg is None else msg
        if line != self._line:
            self.fp.write(line.replace("\r", "") + "\n")
            self.fp.flush()
            self._line = line
        self._line_t = now
        return True

    def clear(self, nolock=False):
        pass

    def close(self):
        if getattr(self, "disable", True):
            return
        if getattr(self, "sp", None) is not None and self.leave is not False:
            self.display(force=True)
        self.disable = True
        self._decr_instances(self)


def bar(*args, **kwargs) -> tqdm:
    """tqdm(*args, **kwargs) on a terminal, LineTqdm elsewhere (same API)."""
    cls = tqdm if is_tty(kwargs.get("file")) else LineTqdm
    return cls(*args, **kwargs)


def write(msg: str) -> None:
    """A message that does not break an active bar (tqdm.write; plain print off a terminal)."""
    tqdm.write(msg)


@contextlib.contextmanager
def quiet_absl():
    """Hide absl WARNING/INFO lines (orbax's notes on every read-only restore: "read_only=True,
    setting save_interval_steps=0", "Metadata file does not exist") while reading a
    checkpoint; errors still show. T5LITE_VERBOSE=1 keeps them."""
    if os.environ.get("T5LITE_VERBOSE"):
        yield
        return
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def drop_closed_event_loop_noise() -> None:
    """After a fallback restore (orbax failed to read a corrupt checkpoint), orbax's pending
    read coroutines are garbage-collected once their asyncio loop is closed, and Python prints
    "Exception ignored in: <coroutine _read_array_index_and_device_put> ... RuntimeError: Event
    loop is closed" tracebacks. They are harmless (the restore already fell back): drop those
    and pass every other unraisable exception on. Installed once by the CLI."""
    previous = sys.unraisablehook
    if getattr(previous, "t5lite", False):
        return

    def hook(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc):
            return
        previous(unraisable)
    hook.t5lite = True
    sys.unraisablehook = hook


class _DropUnretrieved(logging.Filter):
    def filter(self, record):
        return "exception was never retrieved" not in record.getMessage()


@contextlib.contextmanager
def quiet_failed_reads():
    """While reading checkpoints: orbax reads a checkpoint's shards concurrently and raises the
    first failure; the other failed reads stay in asyncio tasks nobody awaits, and asyncio logs
    each one with its traceback ("Task exception was never retrieved") whenever the garbage
    collector finds it -- an automatic collection can come mid-restore, before the caller has
    even caught the first error. Drop that message for the whole read and, when the caller
    marked a failure (`reads.failed = True`), collect at the end inside it, so a corrupt step
    costs the user one line (drop_closed_event_loop_noise handles the coroutines' other
    leftover). A clean read skips the full collection."""
    import gc
    import types
    reads = types.SimpleNamespace(failed=False)
    drop = _DropUnretrieved()
    logger = logging.getLogger("asyncio")
    logger.addFilter(drop)
    try:
        yield reads
    finally:
        try:
            if reads.failed:
                gc.collect()
        finally:
            logger.removeFilter(drop)
