"""Keep XLA:CPU's per-execution buffers in the process heap instead of fresh mmaps (glibc).

XLA:CPU allocates each execution's temporaries with malloc on its worker threads (a T5-tiny
train step: one 316 MB block) and frees them when the step ends. glibc serves blocks that
large with a fresh mmap (above M_MMAP_THRESHOLD, or when a per-thread arena cannot hold them)
and unmaps them on free, so every step page-faults the whole block in again: ~78k minor faults
and ~0.2 s of kernel time per T5-tiny step on 2 cores (~30% of the step). One malloc arena and
mmap / trim thresholds of 512 MiB let the freed block be reused by the next step (0 faults a
step); the cost is that freed memory stays with the process (RSS stays at its high-water mark),
the trade every caching allocator (tcmalloc, jemalloc) makes. The same remedy MaxText applies on
TPU VMs by preloading tcmalloc.

Why 512 MiB and not "everything": the tiny presets' step temporaries are 250-420 MiB, the
100M-parameter presets' 0.65-1.3 GiB (compiled.memory_analysis()). Kept in one heap, blocks that
large fragment it: the 100M presets then ran at 2x the resident memory and 0-17% slower steps
(bench/RESULTS.md, session 8). Above the threshold glibc maps and unmaps as before.
T5LITE_MALLOC_THRESHOLD_MIB (1-2047) moves it.

The cost of one arena: threads that malloc a lot at once (tf.data's parallel maps) share one
lock: the span-corruption pipeline makes 25-45% fewer tokens/s. In a real `t5lite train` run the
pipeline and the steps share the heap and the cores, and there the trade did not pay: the
quickstart config, 60 steps, two runs each, 54-59 s tuned vs 52-54 s untuned, +500 MB RSS
(bench/RESULTS.md, session 8). The gain shows where a process runs jitted steps without a
tf.data pipeline beside them (the train-step benchmark: T5 and BERT tiny steps ~20% faster).
So it is off by default: opt in with T5LITE_TUNE_MALLOC=1 ("auto": tune on CPU-only hosts, i.e.
unless JAX_PLATFORMS names a non-CPU platform or an accelerator device node exists; "0": never,
the default). On an accelerator host the steps' buffers live in device memory anyway.

Call tune_malloc() before JAX starts its backend (XLA's worker threads bind to an arena on their
first malloc; calling it later has no effect); the `t5lite` CLI does, so the variable works for
it. No effect outside glibc (macOS, musl).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

from t5lite.errors import UserError

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
DEFAULT_THRESHOLD_MIB = 512


ACCELERATOR_NODES = ("/dev/nvidia[0-9]*", "/dev/accel[0-9]*", "/dev/vfio/[0-9]*", "/dev/kfd")


def cpu_only_host() -> bool:
    """Will JAX run on the CPU? Decided without starting a backend (which would be too late)."""
    platforms = os.environ.get("JAX_PLATFORMS", "").lower()
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return not any(glob.glob(pattern) for pattern in ACCELERATOR_NODES)


def tune_malloc() -> bool:
    """Set glibc's malloc to keep freed large blocks (see the module doc); True if it did."""
    mode = os.environ.get("T5LITE_TUNE_MALLOC", "0").lower()
    if mode in ("0", "false", "no", "") or (mode == "auto" and not cpu_only_host()):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # glibc only: musl's mallopt is a no-op
    except (OSError, AttributeError):
        return False
    threshold = threshold_bytes()
    return all(libc.mallopt(option, value) == 1 for option, value in (
        (M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, threshold), (M_TRIM_THRESHOLD, threshold)))


def threshold_bytes() -> int:
    """Blocks up to this size stay in the heap (T5LITE_MALLOC_THRESHOLD_MIB, default 512)."""
    raw = os.environ.get("T5LITE_MALLOC_THRESHOLD_MIB", str(DEFAULT_THRESHOLD_MIB))
    try:
        mib = int(raw)
    except ValueError:
        mib = 0
    if not 1 <= mib <= 2047:  # mallopt takes a C int of bytes
        raise UserError(f"T5LITE_MALLOC_THRESHOLD_MIB={raw!r}: give a whole number of MiB from "
                         f"1 to 2047 (default {DEFAULT_THRESHOLD_MIB}), or unset it")
    return mib * 2 ** 20
