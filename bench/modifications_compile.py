"""Compile the pretraining step of every row of Narang et al. 2021's Table 1 (the
modifications table) for a TPU slice on this host, one row at a time, and put the compiled
cost beside the paper's Ops and Step/s columns.

Each row's stage is exactly what `t5lite ablate --table modifications --scale paper` would
train (t5lite/ablations/plan.py: T5 1.0 base sizes, batch 128 x (512 inputs, 114 span
corruption targets), bfloat16, the row's overrides); t5lite.tpu.compile.compile_step compiles
it and reads its per-chip peak memory, the HLO's matmul FLOPs (while loops, scanned layers
included, times their trip counts), the roofline bound and the expected step
(t5lite/tpu/step_time.py). One JSON line per row is appended to --out; a rerun skips the
(row, stage, topology, --set, scan unroll) keys already there, so a killed run resumes;
a row whose plan has changed since its line was written compiles again (`is_current`).

The plan's config (configs/quickstart.py) unrolls each stack inside its scan
(model.scan_unroll=0: faster on a CPU); the bench compiles one layer per loop iteration
(--scan-unroll 1, the default): the same layers, FLOPs and parameters, and a compile several
times cheaper. Stacks whose layers differ are unrolled whatever it says (models/plan.py).

    nice -n 10 python bench/modifications_compile.py --topology v4-8 [--rows vanilla gelu]
    python bench/modifications_compile.py --render   # the markdown table + TPU-hours

--stage finetune_<task> compiles a finetuning stage instead (the TPU-hours estimate scales
the baseline's by each row's pretraining step ratio: t5lite/ablations/estimation.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import time

from t5lite import config as config_lib
from t5lite.ablations import estimation, pretrain_columns
from t5lite.ablations.modifications import TABLE
from t5lite.ablations.plan import default_tasks, row_training_stages

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "modifications_compile.jsonl")
TOPOLOGY = "v4-8"  # 4 chips: the chip count of the paper's v3-8 (its README's 2x2 topology)
# what a stage that does not fit the slice's HBM is compiled again with, in order: micro-batches
# (the paper's Mesh TensorFlow split its batches so too: tokens_per_microbatch_per_replica)
FIT_WITH = ("train.grad_accum_steps=2", "train.grad_accum_steps=4")


def stage_of(row_name: str, stage: str, extra: list, scan_unroll: int | None = None):
    """The row's training stage named ``stage`` ("pretrain" or "finetune_<task>") at paper
    scale, with the bench's own --set overrides on top."""
    tasks = default_tasks(TABLE, "paper")
    if stage.startswith("finetune_"):
        tasks = (stage[len("finetune_"):],)
    stages = row_training_stages(TABLE, TABLE.row(row_name), "/estimate", tasks, "paper",
                                 extra)
    named = {s.kind if s.kind == "pretrain" else f"finetune_{s.task}": s for s in stages}
    if stage not in named:
        raise SystemExit(f"{row_name} has no stage {stage!r}; it has {sorted(named)}")
    st = named[stage]
    if scan_unroll is not None:  # the compile's, not the plan's (the line keeps the plan's)
        st = dataclasses.replace(st, cfg=config_lib.replace(
            st.cfg, [f"model.scan_unroll={scan_unroll}"]))
    return st


def scanned_stacks(cfg) -> dict:
    """Which stacks compile as one scanned layer (heterogeneous stacks are unrolled)."""
    from t5lite.models import plan
    out = {}
    for kind in ("encoder", "decoder"):
        stack = plan.stack_plan(cfg.model, kind)
        out[kind] = stack.shared_scanned if stack.shared_applications else stack.scanned
    return out


def record(row_name: str, stage: str, topology: str, extra: list, scan_unroll) -> dict:
    """Compile one row's stage -> its JSON line (an ``error`` line when the compile failed)."""
    from t5lite import models
    st = stage_of(row_name, stage, extra, scan_unroll)
    paper = dict(zip(TABLE.paper_columns, TABLE.row(row_name).paper))
    line = {"row": row_name, "stage": stage, "topology": topology, "extra": extra,
            "config": st.config, "overrides": st.overrides,
            "scan_unroll": st.cfg.model.scan_unroll,
            "params_M": round(models.count_params(st.cfg.model) / 1e6, 1),
            "scanned": scanned_stacks(st.cfg), "paper_ops_T": paper["Ops (T)"],
            "paper_step_per_s": paper["Step/s"], "load_before": os.getloadavg()[0],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    t0 = time.time()
    try:
        r = estimation.compile_report(st, topology, {})
    except Exception as e:  # noqa: BLE001 - keep the row's failure as data, go on
        return dict(line, error=f"{type(e).__name__}: {str(e).strip()[:400]}",
                    wall_s=round(time.time() - t0, 1))
    return dict(estimation.compiled_line(row_name, st, topology, r), **line,
                wall_s=round(time.time() - t0, 1))


def read_lines(path: str) -> list:
    return pretrain_columns.read_compile_log(path) if os.path.exists(path) else []


def key(line: dict) -> tuple:
    # a line without scan_unroll compiled the plan's value (0)
    return (line["row"], line["stage"], line["topology"], tuple(line.get("extra", ())),
            line.get("scan_unroll", 0))


def is_current(line: dict) -> bool:
    """The line compiled the step its row's stage plans today (estimation.same_step): a row
    whose plan changed since is compiled again, and its old line is no longer shown."""
    now = stage_of(line["row"], line["stage"], list(line.get("extra", ())), None).cfg
    return estimation.same_step(line, now)


def render(lines: list, topology: str) -> None:
    """The compiled rows beside the paper's columns, then the whole table's TPU-hours at paper
    scale from the compiled steps (a stage that does not fit as planned: its fitting variant,
    pretrain_columns.fitted_lines; a row whose stages are not all compiled is left out of the
    total and named; nothing is compiled here). Lines of a plan that has changed since are
    left out and named."""
    lines = [x for x in lines if x.get("scan_unroll", 0) == 1]  # the set compiled alike
    current = [x for x in lines if is_current(x)]
    stale = sorted({x["row"] for x in lines} - {x["row"] for x in current})
    if stale:
        print(f"compiled before their plan changed (left out; compile them again): "
              f"{', '.join(stale)}\n")
    lines = pretrain_columns.fitted_lines(current)
    print(pretrain_columns.compiled_table(TABLE, lines, topology) + "\n")
    estimation.estimate(TABLE, scale="paper", topology=topology, compiled=lines,
                        compile_missing=False)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default=TOPOLOGY)
    p.add_argument("--rows", nargs="*", default=[r.name for r in TABLE.rows])
    p.add_argument("--stage", default="pretrain", help="pretrain or finetune_<task>")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="extra override on every row (e.g. model.scan_layers=False)")
    p.add_argument("--scan-unroll", type=int, default=1,
                   help="model.scan_unroll of the compile (-1: the plan's own, 0)")
    p.add_argument("--out", default=OUT)
    p.add_argument("--fit-with", nargs="*", default=list(FIT_WITH), metavar="KEY=VALUE",
                   help="a stage that does not fit is compiled again with each of these "
                   "added (in order) until one fits")
    p.add_argument("--retry-errors", action="store_true",
                   help="compile again the rows whose line is an error")
    p.add_argument("--since", default="", metavar="YYYY-MM-DD",
                   help="compile again the rows whose line is older (e.g. written before a "
                   "change of compiler options, which the plan's config does not show)")
    p.add_argument("--render", action="store_true", help="print the table and TPU-hours")
    args = p.parse_args(argv)
    if args.render:
        render(read_lines(args.out), args.topology)
        return
    done = {key(x): x for x in read_lines(args.out)
            if not (args.retry_errors and "error" in x) and x.get("date", "") >= args.since
            and is_current(x)}
    unroll = None if args.scan_unroll < 0 else args.scan_unroll
    for name in args.rows:
        for fit in [None] + args.fit_with:
            extra = args.extra + ([fit] if fit else [])
            k = (name, args.stage, args.topology, tuple(extra),
                 stage_of(name, args.stage, extra, unroll).cfg.model.scan_unroll)
            line = done.get(k) or compile_one(args.out, name, args.stage, args.topology, extra,
                                              unroll)
            if line.get("fits") or "error" in line:
                break


def compile_one(out: str, name: str, stage: str, topology: str, extra: list, unroll) -> dict:
    line = record(name, stage, topology, extra, unroll)
    with open(out, "a") as f:
        f.write(json.dumps(line) + "\n")
    print(json.dumps({x: line.get(x) for x in (
        "row", "extra", "fits", "peak_gib_per_chip", "ops_T", "expected_step_seconds",
        "wall_s", "error")}), flush=True)
    return line


if __name__ == "__main__":
    main()
