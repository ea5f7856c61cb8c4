"""A config compiled for its TPU slice with and without the asynchronous-collective XLA options
of its chip generation (t5lite/mesh/xla_flags.py), or with some of them left out: per-chip
memory, roofline and expected MFU, blocking / asynchronous collectives (bench/RESULTS.md,
issue 50). One compile per process (libtpu's compiler keeps memory between compiles).

    python bench/async_collectives.py t5_1_1_xl                   # the table's options
    python bench/async_collectives.py t5_1_1_xl --flags off       # libtpu's defaults
    python bench/async_collectives.py t5_1_1_xl --flags without=xla_enable_async_all_gather
    python bench/async_collectives.py gpt2_small --topology v5p:2x2x2 --set data.batch_size=32
    python bench/async_collectives.py t5_1_1_xl --add xla_enable_async_all_reduce=true

    python bench/async_collectives.py --analyze                   # re-read the kept programs

Each run appends one JSON line to bench/async_collectives.jsonl and keeps the compiled module
(gzip) under $T5LITE_ASYNC_DIR (default /tmp/t5lite_async_collectives): --analyze recomputes
every line's roofline and expected figures from them, so a change to the cost or step-time
model needs no recompile.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # abstract devices: no TPU opened

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "async_collectives.jsonl")
KEEP = os.environ.get("T5LITE_ASYNC_DIR", "/tmp/t5lite_async_collectives")


def options_for(generation: str, flags: str) -> dict:
    """--flags on | off | without=A,B | only=A,B -> the options the compile gets."""
    from t5lite.mesh import xla_flags
    table = xla_flags.async_collective_options(generation)
    if flags == "on":
        return table
    if flags == "off":
        return {}
    how, _, names = flags.partition("=")
    names = set(names.split(","))
    unknown = names - set(table)
    if how not in ("without", "only") or unknown:
        raise SystemExit(f"--flags {flags}: use on, off, without=NAMES or only=NAMES of "
                         f"{sorted(table)}" + (f" (not in the table: {sorted(unknown)})"
                                               if unknown else ""))
    return {k: v for k, v in table.items() if (k in names) == (how == "only")}


def row(r: dict, cfg_name: str, flags: str, options: dict) -> dict:
    """The figures RESULTS.md records from one compile report."""
    rev = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    return {"config": cfg_name, "topology": r["topology"], "mesh": r["mesh"],
            "remat": r["remat"], "batch_size": r["batch_size"], "flags": flags,
            "options": options, "compiled": r["compiled"],
            "gib_per_chip": r["bytes_per_chip"]["total"] / 2 ** 30,
            "roofline_step_seconds": r["roofline_step_seconds"],
            "roofline_mfu": r["roofline_mfu"], "bound": r.get("bound"),
            "expected_step_seconds": r["expected_step_seconds"],
            "expected_mfu": r["expected_mfu"], "expected_seconds": r["expected_seconds"],
            "expected_collectives": r["expected_collectives"],
            "model_flops_per_chip": r["model_flops_per_chip"],
            "compile_seconds": r["compile_seconds"], "revision": rev,
            "date": datetime.date.today().isoformat()}


def _keep_modules() -> list:
    """(text, device coordinates) of every module step_time.expected_step reads in this
    process (the compiled train step's), for the kept copy."""
    from t5lite.tpu import step_time
    texts, expected = [], step_time.expected_step

    def keep(text, chip, shape, coords=None):
        texts.append((text, coords))
        return expected(text, chip, shape, coords)
    step_time.expected_step = keep
    return texts


def analyze() -> int:
    """Recompute every line's figures from its kept module (the cost and step-time models as
    they are now); rewrite bench/async_collectives.jsonl."""
    from t5lite.mesh import topology
    from t5lite.tpu import hlo_cost, step_time
    lines = [json.loads(x) for x in open(OUT)]
    for r in lines:
        with gzip.open(os.path.join(KEEP, r["hlo"]), "rt") as f:
            text = f.read()
        topo = topology.parse_topology(r["topology"])
        times = hlo_cost.roofline_seconds(hlo_cost.hlo_costs(text, topo.chip), topo.chip)
        bound = max(times.values())
        e = step_time.expected_step(text, topo.chip, topo.shape, r["coords"])
        expected = max(e["seconds"], bound)
        r.update(roofline_step_seconds=bound, expected_step_seconds=expected,
                 roofline_mfu=r["model_flops_per_chip"] / (bound * topo.chip.peak_flops),
                 expected_mfu=r["model_flops_per_chip"] / (expected * topo.chip.peak_flops),
                 expected_seconds={"compute": e["compute_seconds"],
                                   "collectives": e["collective_seconds"],
                                   "exposed_collectives": e["exposed_seconds"]},
                 expected_collectives={"sync": e["sync_collectives"],
                                       "async": e["async_collectives"]})
        print(json.dumps(r))
    with open(OUT, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in lines)
    return 0


def main(argv=None) -> int:
    if argv is None and sys.argv[1:] == ["--analyze"] or argv == ["--analyze"]:
        return analyze()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("--topology", default="", help="default: the config's mesh.topology")
    p.add_argument("--flags", default="on", help="on | off | without=A,B | only=A,B")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--add", action="append", default=[], metavar="FLAG=true|false",
                   help="an XLA option beside --flags' (a candidate for the table)")
    a = p.parse_args(argv)
    from t5lite import config as config_lib
    from t5lite.mesh import topology, xla_flags
    from t5lite.tpu import compile as tpu_compile
    cfg = config_lib.load_config(a.config, a.set)
    topo = topology.parse_topology(a.topology or cfg.mesh.topology)
    options = options_for(topo.chip.name, a.flags)
    for item in a.add:
        name, _, value = item.partition("=")
        options[name] = {"true": True, "false": False}.get(value.lower(), value)
    flags = a.flags + "".join(f" +{item}" for item in a.add)
    # the one table compiler_options reads: this process's compiles get exactly `options`
    xla_flags.ASYNC_COLLECTIVES[topo.chip.name] = options
    texts = _keep_modules()
    r = tpu_compile.compile_step(cfg, topo)
    line = row(r, a.config + "".join(f" --set {s}" for s in a.set), flags, options)
    os.makedirs(KEEP, exist_ok=True)
    text, coords = texts[-1]
    line["hlo"] = hashlib.sha1(text.encode()).hexdigest()[:16] + ".hlo.gz"
    with gzip.open(os.path.join(KEEP, line["hlo"]), "wt") as f:
        f.write(text)
    line["coords"] = [list(c) for c in coords] if coords is not None else None
    with open(OUT, "a") as f:
        f.write(json.dumps(line) + "\n")
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
