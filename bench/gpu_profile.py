"""Where a train step's device time goes, from a jax.profiler trace (an .xplane.pb file).

    python bench/gpu_profile.py TRACE.xplane.pb[.gz] --steps 3 [--step-ms 192.5]

bench/gpu_step.py --trace CASE captures one (t5lite's side, after its timed steps) and writes
this summary beside it. Kernels are read from the GPU plane's stream lines (CUPTI's records:
each kernel with its XLA op in the "hlo_op" stat); on a CPU the host plane's XLA ops stand in,
so the same code is tested without a GPU. Each kernel is put in one class by its name and op:
matmul (cuBLAS / cuBLASLt / XLA's Triton GEMM fusions), attention (cuDNN's fused attention,
t5lite's Pallas kernels), copy (memcpy / memset), fusion (XLA's elementwise and reduction
fusions), other. Figures per step: the trace's kernel time over --steps; "idle" is the timed
step (--step-ms) less the kernel time: host overhead, launch gaps and waits, an estimate that
assumes one stream (kernels that overlap on several streams make it an underestimate).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

CLASSES = (  # (class, substrings of the lower-cased kernel name or op); the first match wins
    ("attention", ("cudnn", "fmha", "flash", "sdpa", "attention", "pallas")),
    ("matmul", ("gemm", "cublas", "nvjet", "xmma", "cutlass", "wgmma", "dot", "matmul")),
    ("copy", ("memcpy", "memset", "copy")),
    ("fusion", ("fusion", "reduce", "loop", "input_", "transpose", "convert", "scatter",
                "gather", "select", "broadcast")),
)


def kernel_class(name: str, op: str) -> str:
    text = f"{name} {op}".lower()
    return next((c for c, keys in CLASSES if any(k in text for k in keys)), "other")


def _events(profile):
    """(kernel name, XLA op, duration ns) of every device kernel: the GPU planes' stream
    lines; without a GPU plane, the host's events that carry an hlo_op (XLA:CPU's thunks)."""
    gpu = [p for p in profile.planes if p.name.startswith("/device:GPU")]
    if gpu:
        for plane in gpu:
            lines = [ln for ln in plane.lines if ln.name.startswith("Stream")] or \
                list(plane.lines)
            for line in lines:
                for e in line.events:
                    stats = dict(e.stats)
                    yield e.name, str(stats.get("hlo_op", "")), e.duration_ns
        return
    for plane in profile.planes:
        for line in plane.lines:
            for e in line.events:
                stats = dict(e.stats)
                if "hlo_op" in stats:
                    yield e.name, str(stats["hlo_op"]), e.duration_ns


def summarize(path: str, steps: int, step_ms: float | None = None, top: int = 25) -> dict:
    """Per-step kernel time by class and the ``top`` kernels (ms per step, launches per step)."""
    import gzip

    import jax
    if path.endswith(".gz"):  # as bench/traces/ keeps them
        with gzip.open(path, "rb") as f:
            profile = jax.profiler.ProfileData.from_serialized_xspace(f.read())
    else:
        profile = jax.profiler.ProfileData.from_file(path)
    by_class, by_kernel = collections.Counter(), collections.Counter()
    count, ops = collections.Counter(), collections.defaultdict(set)
    for name, op, ns in _events(profile):
        ms = ns / 1e6 / steps
        by_class[kernel_class(name, op)] += ms
        by_kernel[name] += ms
        count[name] += 1
        ops[name].add(op)
    busy = sum(by_class.values())
    out = dict(steps=steps, kernel_ms_per_step=busy,
               classes={c: round(ms, 3) for c, ms in by_class.most_common()},
               top=[dict(kernel=k[:120], ms=round(ms, 3), launches=count[k] / steps,
                         op=next(iter(ops[k]))[:60] if len(ops[k]) == 1 else
                         f"{len(ops[k])} ops", cls=kernel_class(k, " ".join(ops[k])))
                    for k, ms in by_kernel.most_common(top)],
               kernels_per_step=sum(count.values()) / steps)
    if step_ms:
        out.update(step_ms=step_ms, idle_ms_estimate=step_ms - busy)
    return out


def table(summary: dict) -> str:
    step = summary.get("step_ms") or summary["kernel_ms_per_step"]
    rows = [f"kernel time {summary['kernel_ms_per_step']:.1f} ms / step "
            f"({summary['kernels_per_step']:.0f} launches)"
            + (f", timed step {step:.1f} ms" if summary.get("step_ms") else ""),
            "| class | ms / step | % of step |", "|---|---|---|"]
    classes = dict(summary["classes"])
    if summary.get("step_ms"):
        classes["idle (step - kernels)"] = summary["idle_ms_estimate"]
    rows += [f"| {c} | {ms:.2f} | {ms / step:.1%} |" for c, ms in classes.items()]
    rows += ["", "| kernel | op | class | ms / step | launches / step |", "|---|---|---|---|---|"]
    rows += [f"| {k['kernel'][:70]} | {k['op']} | {k['cls']} | {k['ms']:.2f} | "
             f"{k['launches']:g} |" for k in summary["top"]]
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("xplane", help="a .xplane.pb file (jax.profiler.trace writes one), or "
                   "one gzipped")
    p.add_argument("--steps", type=int, required=True, help="train steps the trace holds")
    p.add_argument("--step-ms", type=float, default=None, help="the timed step, for idle")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", action="store_true", help="the summary as JSON")
    args = p.parse_args(argv)
    summary = summarize(args.xplane, args.steps, args.step_ms, args.top)
    print(json.dumps(summary) if args.json else table(summary))


if __name__ == "__main__":
    sys.exit(main())
