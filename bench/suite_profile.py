"""Where the test suite's time goes: a pytest plugin that writes, per test, its wall time
(setup + call + teardown) and the seconds jax.monitoring reports for the XLA compiles, traces
and lowerings made in that test's process; then a summary of those lines.

    SUITE_PROFILE=/tmp/prof PYTHONPATH=bench python -m pytest -q -n 2 -p suite_profile tests
    python bench/suite_profile.py /tmp/prof.*        # the summary (bench/RESULTS.md)

Each worker appends to SUITE_PROFILE.<pid>. CLI runs a test starts are in its wall time only.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

import pytest

EVENTS = {"/jax/core/compile/backend_compile_duration": "compile",
          "/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}
_seconds: dict = {}
_listening: list = []


def _listen() -> None:
    if _listening:
        return
    import jax.monitoring  # here, not at import: conftest sets XLA_FLAGS before jax loads

    def add(event, secs, **_):
        if event in EVENTS:
            _seconds[EVENTS[event]] = _seconds.get(EVENTS[event], 0.0) + secs
    jax.monitoring.register_event_duration_secs_listener(add)
    _listening.append(add)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _listen()
    _seconds.clear()
    start = time.perf_counter()
    yield
    row = {"id": item.nodeid, "wall": round(time.perf_counter() - start, 2),
           **{k: round(v, 2) for k, v in _seconds.items()}}
    with open(f"{os.environ['SUITE_PROFILE']}.{os.getpid()}", "a") as f:
        f.write(json.dumps(row) + "\n")


def summarize(rows: list[dict]) -> str:
    total = {k: sum(r.get(k, 0.0) for r in rows) for k in ("wall", *EVENTS.values())}
    lines = [f"{len(rows)} tests, {total['wall']:.0f} s of test time: compiles "
             f"{total['compile']:.0f} s, tracing {total['trace']:.0f} s, lowering "
             f"{total['lower']:.0f} s (in-process only)"]
    for lo, hi in ((60, None), (30, 60), (10, 30), (3, 10), (0, 3)):
        some = [r for r in rows if r["wall"] >= lo and (hi is None or r["wall"] < hi)]
        span = f">= {lo} s" if hi is None else f"{lo}-{hi} s"
        lines.append(f"  {span:>8}: {len(some):4d} tests, {sum(r['wall'] for r in some):6.0f} s")
    by_file = collections.Counter()
    for r in rows:
        by_file[r["id"].split("::")[0]] += r["wall"]
    lines.append("longest files: " + ", ".join(f"{f} {s:.0f}" for f, s in by_file.most_common(8)))
    lines.append("longest tests:")
    lines += [f"  {r['wall']:7.1f} s (compile {r.get('compile', 0):5.1f}) {r['id']}"
              for r in sorted(rows, key=lambda r: -r["wall"])[:15]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize([json.loads(line) for path in sys.argv[1:] for line in open(path)]))
