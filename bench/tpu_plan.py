"""Every preset at its paper batch and lengths, compiled for a realistic TPU slice on this host
(t5lite.tpu.compile: libtpu, no TPU) -> bench/TPU_PLAN.md.

    python bench/tpu_plan.py [--rows t5_1_1_small gpt2_small ...] [--jsonl bench/tpu_plan.jsonl]

Each row: the slice, the mesh, per-chip GiB (XLA's memory_analysis) next to the analytic
minimum, fits, compiled vs model FLOPs, the roofline bound and the expected MFU. Results
are appended to the JSONL file as each compile finishes (big presets take many minutes on 2
cores) and TPU_PLAN.md is re-rendered from it, so rows never compiled say so.

A stored report whose XLA options or jax / libtpu versions differ from what `t5lite compile`
would use today (it records both) is not shown as a figure: its row says to recompile it.

Analytic minimum per chip: t5lite.tpu.memory.analytic_bytes (state + saved activations by remat
policy + one layer's working set + logits), in every compile report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# row -> (topology, --set overrides). A preset's own row is the preset as shipped on the slice
# it states (mesh.topology; "" here): its mesh, remat and batch are what `t5lite compile
# --search` ranked fastest there (bench/RESULTS.md, issue 34), so its command has no flags.
# "@" rows are variants of a preset.
PRESETS = ("t5_1_0_small", "t5_1_0_base", "t5_1_0_large", "t5_1_0_3b", "t5_1_0_11b",
           "t5_1_1_small", "t5_1_1_base", "t5_1_1_large", "t5_1_1_xl", "t5_1_1_xxl",
           "bert_base", "bert_large", "roberta_base", "electra_small", "gpt2_small",
           "gpt2_medium", "gpt2_large")
ROWS = {name: ("", []) for name in PRESETS}
ROWS.update({
    # full remat: a fraction of the activation memory, a fifth more FLOPs
    "t5_1_1_xl@remat_full": ("", ["model.remat=full"]),
    "t5_1_1_xxl@remat_full": ("", ["model.remat=full"]),
    # no remat: what 3B shipped before its full-remat step compiled with collective matmuls off
    "t5_1_0_3b@remat_none": ("", ["model.remat=none"]),
    # what the XL preset shipped before it stated a slice: data-parallel (parameters and
    # optimizer state copied on every chip), full remat, batch 128
    "t5_1_1_xl@data_parallel": ("v5p-64", ["mesh.data=-1", "mesh.fsdp=1", "model.remat=full",
                                           "data.batch_size=128"]),
    # 11B as it shipped before its tensor-parallel search: fsdp over all 64 chips
    "t5_1_0_11b@fsdp64": ("", ["mesh.data=1", "mesh.fsdp=-1", "mesh.tensor=1",
                               "model.remat=full"]),
    # XXL as it shipped before its tensor-parallel search: fsdp over all 128 chips
    "t5_1_1_xxl@fsdp128": ("", ["mesh.fsdp=-1", "mesh.tensor=1", "model.remat=none"]),
    # the setting of ../shared/TPU_ANCHOR.md (t5x vs t5lite): 8 chips, fsdp=8, layers unrolled
    "t5_1_1_base@anchor": ("v5p:2x2x2", ["mesh.data=1", "mesh.fsdp=-1",
                                         "model.scan_layers=false"]),
})
GiB = 1024 ** 3


def analytic_min(cfg, r) -> float:
    """memory.analytic_bytes of the report's config, mesh and remat, by today's model (the
    figure a report stored was the model's when it compiled)."""
    from t5lite import config
    from t5lite.tpu import memory
    b = r["bytes_per_chip"]
    cfg = config.replace(cfg, [f"model.remat={r['remat']}"]) if "remat" in r else cfg
    return memory.analytic_bytes(cfg, r["mesh"], b["params"], b["opt_state"])["total"]


def _setting(name: str, sets: list, topology: str = "", report=None) -> tuple:
    """(config name, slice, the resolved config as JSON) of a row: what makes two rows the
    same compile (the slice a config states is no part of the program). ``report``: a
    measured row, whose own remat, batch, micro-batches and mesh count (the preset's values
    may have changed since it was compiled)."""
    from t5lite import config
    from t5lite.mesh import topology as tpu_topology
    from t5lite.mesh import partitioning
    preset = name.split("@")[0]
    cfg = config.load_config(preset, sets)
    topology = topology or cfg.mesh.topology
    if report is None:
        fixed = []
        mesh = dict(zip(partitioning.MESH_AXES, partitioning.mesh_shape(
            cfg.mesh, tpu_topology.parse_topology(topology).chips)))
    else:
        fixed = [f"model.remat={report['remat']}", f"data.batch_size={report['batch_size']}",
                 f"train.grad_accum_steps={report['grad_accum_steps']}"]
        mesh = report["mesh"]
    cfg = config.load_config(preset, sets + fixed + [f"mesh.{k}={v}" for k, v in mesh.items()])
    d = config.to_dict(cfg)
    d["mesh"].pop("topology", None)
    return preset, topology, json.dumps(d, sort_keys=True, default=str)


def command(name: str) -> str:
    topology, sets = ROWS[name]
    return " ".join([f"t5lite compile --config {name.split('@')[0]}"]
                    + ([f"--topology {topology}"] if topology else [])
                    + [f"--set {s}" for s in sets])


def run_row(name: str) -> dict:
    from t5lite import config
    from t5lite.mesh import topology as tpu_topology
    from t5lite.tpu import compile as tpu_compile
    topology, sets = ROWS[name]
    cfg = config.load_config(name.split("@")[0], sets)
    t0 = time.time()
    r = tpu_compile.compile_step(cfg, tpu_topology.parse_topology(topology
                                                                  or cfg.mesh.topology))
    r["wall_seconds"] = time.time() - t0
    r["set"] = sets
    r["row"] = name
    r["command"] = command(name)
    return r


def add_report(name: str, path: str, jsonl: str) -> None:
    """Append a `t5lite compile --json` report of ROWS[name]'s config as that row's line."""
    r = json.loads(open(path).read().strip().splitlines()[-1])
    if r.get("config") != name.split("@")[0]:
        raise SystemExit(f"{path} compiled {r.get('config')!r}, not {name}")
    r.update(set=[], row=name, command=command(name), wall_seconds=None)
    with open(jsonl, "a") as f:
        f.write(json.dumps(r, default=str) + "\n")


def measured(jsonl: str) -> dict:
    """The newest report of every setting in the JSONL file, by _setting: a row reuses a
    compile of the same program written under another name or with other (equivalent) flags."""
    done = {}
    if os.path.exists(jsonl):
        for line in open(jsonl):
            r = json.loads(line)
            if "xla_temp" in r["bytes_per_chip"]:  # compiled since the total became the peak
                name = r.get("row", r["config"])
                done[_setting(name, r["set"], r["topology"], r)] = r
    return done


def stale(r: dict) -> str:
    """Why a stored report no longer shows what `t5lite compile` builds for its setting: it
    compiled under other XLA options (partitioning.compiler_options changed since) or another
    jax / libtpu; "" when neither, or when the report predates recording them."""
    from t5lite.mesh import partitioning
    from t5lite.tpu import compile as tpu_compile
    why = []
    if "compiler_options" in r and r["compiler_options"] != partitioning.tpu_compiler_options(
            r["chip"], r["collective_matmul"]):
        why.append("other XLA options")
    if "versions" in r and r["versions"] != tpu_compile.versions():
        why.append("jax " + " + libtpu ".join(r["versions"][k] for k in ("jax", "libtpu")))
    return " and ".join(why)


def _figures(r: dict) -> str:
    """The bound and expected cells of a row (a report from before the expected step has
    the bound as est_*)."""
    bound = r.get("roofline_step_seconds", r.get("est_step_seconds"))
    mfu = r.get("roofline_mfu", r.get("est_mfu"))
    cells = f"{bound * 1e3:.0f} ms ({r['bound']}) / {mfu:.0%} | "
    if r.get("expected_step_seconds") is None:
        return cells + "-"
    return cells + f"{r['expected_step_seconds'] * 1e3:.0f} ms / {r['expected_mfu']:.0%}"


def shortfall(r: dict, target: float = 0.6, name: str = "") -> str | None:
    """One table row: why a compiled preset's expected MFU is under ``target`` (issue 50
    item 1), from its own report; ``name``: the plan's row (a report compiled for one row can
    serve another with the same setting, so the report's own row name may differ). The
    expected step is the instructions' time (the sum of each instruction's roofline: its
    FLOPs at peak or its HBM bytes at bandwidth, whichever is longer) plus the collectives
    the schedule leaves exposed; MFU scales as 1 / step."""
    if r.get("expected_step_seconds") is None or r["expected_mfu"] >= target:
        return None
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    step, mfu = r["expected_step_seconds"], r["expected_mfu"]
    instr = r["expected_seconds"]["compute"]
    exposed = r["expected_seconds"]["exposed_collectives"]
    flops = r["roofline_seconds"]["compute"]
    need = step * mfu / target  # the step that would reach the target
    instr_mfu = step * mfu / instr
    hbm = (f"HBM: the instructions alone reach {instr_mfu:.0%} (their FLOPs at peak "
           f"{ms(flops)} ms, their memory traffic makes {ms(instr)} ms)")
    coll = f"exposed collectives: {ms(exposed)} ms ({exposed / step:.0%} of the step)"
    if instr_mfu >= target:
        what = (f"exposed collectives: {ms(exposed)} ms beyond the instructions; "
                f"{target:.0%} needs under {ms(need - instr)} ms exposed")
    elif exposed < 0.1 * step:
        what = hbm
    else:  # both: the larger cut first (the instructions' is what even no exposure leaves)
        what = "; ".join([coll, hbm] if exposed > instr - need else [hbm, coll])
    return (f"| {name or r.get('row', r['config'])} | {r['topology']} | {mfu:.1%} | "
            f"{ms(step)} | {ms(need)} | {ms(flops)} | {ms(instr)} | {ms(exposed)} | {what} |")


def render(jsonl: str, out: str) -> None:
    by_setting = measured(jsonl)
    done, old = {}, {}
    for name, (topology, sets) in ROWS.items():
        r = by_setting.get(_setting(name, sets, topology))
        why = stale(r) if r is not None else ""
        if why:
            old[name] = f"compiled with {why}: recompile (`--rows {name}`)"
        elif r is not None:
            done[name] = r
    g = lambda n: f"{n / GiB:.2f}"  # noqa: E731
    lines = [
        "# TPU plan: every preset compiled for a TPU slice on a CPU host",
        "",
        "Written by `python bench/tpu_plan.py` (t5lite.tpu.compile, jax 0.10.2 + libtpu "
        "0.0.42.1, no TPU). Per chip; GiB = 2^30 bytes. *model* = params + grads + optimizer "
        "state + the activations the remat policy saves + one layer's working set + logits "
        "(t5lite.tpu.memory.analytic_bytes): an estimate of the live set, not a bound (the "
        "compiled total is below it where XLA fuses the float32 logits into the loss). "
        "FLOPs: compiled (the HLO's matmuls, every loop x its trip count) / model (3 x "
        "forward matmuls, + remat recompute). Two step times from the chip table in "
        "t5lite/mesh/topology.py: the *roofline bound* (no step runs faster: the largest of "
        "FLOPs / peak, HBM bytes / bandwidth (operands in VMEM excluded), collective bytes "
        "/ the chip's whole ICI bandwidth and the sum of every instruction's own roofline; "
        "`roofline_seconds` in the JSON) and the *expected* step (t5lite/tpu/step_time.py: "
        "the compiled schedule replayed on the slice's torus, collectives on the links their "
        "groups span, the ones not hidden behind compute added; bench/RESULTS.md checks it "
        "against published MaxText MFU). Rows compiled before the expected step existed show "
        "the bound only. Compiled with `mesh.collective_matmul=false` (the default; README).",
        "",
        "| preset | slice | mesh | remat | batch | GiB/chip (params+opt / temp / total) | "
        "model GiB | HBM | fits | compiled / model FLOPs | bound: step / MFU | "
        "expected: step / MFU | compile |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (topology, sets) in ROWS.items():
        r = done.get(name)
        if r is None:
            why = old.get(name, "not compiled in this session (see below)")
            lines.append(f"| {name} | {_setting(name, sets, topology)[1]} | | | | not measured: "
                         f"{why} | | | | | | | |")
            continue
        b = r["bytes_per_chip"]
        mesh = "x".join(f"{k[0]}{v}" for k, v in r["mesh"].items())
        if not r.get("compiled", True):
            lines.append(
                f"| {name} | {r['topology']} | {mesh} | {r['remat']} | {r['batch_size']} | "
                f"{g(b['params'] + b['opt_state'])} / {g(b['temp'])} (XLA) / {g(b['total'])} | "
                f"- | {g(r['hbm_bytes_per_chip'])} | NO: XLA out of HBM | - | - | - | "
                f"{r['compile_seconds']:.0f} s |")
            continue
        from t5lite import config
        mn = analytic_min(config.load_config(name.split("@")[0], r["set"]), r)
        ratio = r["flops_per_chip"] / r["model_flops_with_remat_per_chip"]
        lines.append(
            f"| {name} | {r['topology']} | {mesh} | {r['remat']} | {r['batch_size']} | "
            f"{g(b['params'] + b['opt_state'])} / {g(b['temp'])} / {g(b['total'])} | "
            f"{g(mn)} | {g(r['hbm_bytes_per_chip'])} | "
            f"{'yes' if r['fits'] else 'NO'} | {r['flops_per_chip']:.3g} / "
            f"{r['model_flops_with_remat_per_chip']:.3g} ({ratio:.2f}) | "
            f"{_figures(r)} | {r['compile_seconds']:.0f} s |")
    short = [x for x in (shortfall(done[n], name=n) for n in ROWS if n in done) if x]
    if short:
        lines += ["", "What keeps each row under 60% expected MFU (its own report; ms per step; "
                  "*FLOPs at peak*: the compiled FLOPs at the chip's peak, the floor no "
                  "schedule beats; *instructions*: each instruction's roofline summed; "
                  "*exposed*: collectives the schedule does not hide):", "",
                  "| row | slice | expected MFU | expected step | step for 60% | FLOPs at peak "
                  "| instructions | exposed | what stops it |",
                  "|---|---|---|---|---|---|---|---|---|",
                  *short]
    lines += ["", "Commands (each row is `t5lite compile` with these flags):", ""]
    for name in ROWS:
        if name in done:
            lines.append(f"    {command(name)}")
    lines += ["", "Raw reports: `bench/tpu_plan.jsonl` (one JSON object per row, as "
              "`t5lite compile --json` prints).", "",
              "Rows marked *not measured* were not compiled: on the shared 2-core host one "
              "compile of a small or base preset took 8 to 30 minutes (niced, load 5-12) "
              "and the XL/XXL ones take longer; `python bench/tpu_plan.py --rows NAME` adds a "
              "row. A row that XLA refused (its temporaries exceed HBM) is a measured *does "
              "not fit*: the preset needs remat, micro-batches or more chips there "
              "(`t5lite compile --search` finds which).", "",
              "Memory: the compiled program's peak per chip (`peak_memory_in_bytes`, the "
              "figure libtpu's own HBM check compares; *temp* = the temporaries live at it). "
              "XLA's `temp_size_in_bytes` (`xla_temp` in the JSON) is larger on scanned "
              "steps; rows before session 16 added it to the arguments and are not shown.", "",
              "Caveats: the bound and the expected step are models: "
              "HBM bytes are the compiled HLO's top-level instructions' reads and writes "
              "outside VMEM (hlo_cost.hlo_costs), with no cache or overlap effects beyond the "
              "per-instruction sum."]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--rows", nargs="*", default=list(ROWS), help=f"of {', '.join(ROWS)}")
    p.add_argument("--jsonl", default=os.path.join(here, "tpu_plan.jsonl"))
    p.add_argument("--out", default=os.path.join(here, "TPU_PLAN.md"))
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--add-report", nargs=2, action="append", default=[],
                   metavar=("ROW", "FILE"), help="append the report in FILE (what `t5lite "
                   "compile --config ROW --json [--set ...]` printed) instead of compiling "
                   "ROW again; it is ROW's figure where its mesh, remat and batch are the "
                   "preset's")
    args = p.parse_args()
    for name, path in args.add_report:
        add_report(name, path, args.jsonl)
    if args.add_report:
        args.render_only = True
    if not args.render_only:
        for name in args.rows:
            print(f"compiling {name} for {ROWS[name][0]} ...", flush=True)
            r = run_row(name)
            print(f"  {r['bytes_per_chip']['total'] / GiB:.2f} GiB per chip, fits {r['fits']}, "
                  + (f"expected MFU {r['expected_mfu']:.1%}, " if r["compiled"]
                     else "XLA out of HBM, ")
                  + f"{r['compile_seconds']:.0f} s", flush=True)
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(r, default=str) + "\n")
            render(args.jsonl, args.out)
    render(args.jsonl, args.out)


if __name__ == "__main__":
    main()
