"""What a study costs before it runs: the training steps and tokens of every stage and, for a
TPU slice, the TPU-hours from an AOT compile of each distinct stage config."""

from __future__ import annotations

from typing import Sequence

from t5lite.ablations.plan import (Stage, check_tasks, default_tasks,
                                   row_training_stages)
from t5lite.ablations.tables import Table, as_table
from t5lite.errors import UserError
from t5lite.monitor import flops as flops_lib
from t5lite.tpu import report as tpu_report


def _compile_report(stage: Stage, topology: str, cache: dict) -> dict:
    """The AOT compile report of one stage's train step on ``topology`` (what `t5lite compile
    --json` prints), cached by the stage's config file and overrides."""
    key = (stage.config, tuple(stage.overrides))
    if key in cache:
        return cache[key]
    try:
        from t5lite.tpu.compile import compile_step
        from t5lite.tpu.topology import parse_topology, require_libtpu
    except ImportError:
        raise UserError("--topology needs `t5lite compile` (AOT compile for TPU), which "
                        "this install lacks; --estimate without --topology prints the "
                        "steps and tokens.") from None
    try:
        topo = parse_topology(topology)
        require_libtpu()
        cache[key] = compile_step(stage.cfg, topo)
    except UserError as e:
        raise UserError(f"t5lite compile failed for {stage.workdir}: {e}") from None
    except Exception as e:  # noqa: BLE001 - XLA and libtpu raise plain runtime errors
        last = (str(e).strip().splitlines() or [""])[-1]
        raise UserError(f"t5lite compile failed for {stage.workdir}: "
                        f"{type(e).__name__}: {last}") from e
    return cache[key]


def _chip_seconds(table: Table, row_name: str, stages: list[Stage], topology: str,
                  cache: dict) -> float:
    """Chips x expected step seconds x steps, summed over the stages."""
    seconds = 0.0
    for st in stages:
        report = _compile_report(st, topology, cache)
        if not report.get("fits", True):
            raise UserError(f"{table.name}/{row_name} {st.kind} does not fit "
                            f"{topology} ({report.get('bytes_per_chip', {}).get('total')} "
                            f"bytes per chip); try a larger topology or --set "
                            "mesh / remat settings.")
        step, _ = tpu_report.step_figures(report)  # the expected step
        seconds += (st.cfg.train.steps - st.start) * float(step) * int(report["chips"])
    return seconds


def _hours(h: float) -> str:
    return f"{h:,.1f}" if h >= 10 else f"{h:.3g}"  # tiny rows: seconds, not "0.0"


def _print_estimate(table: Table, scale: str, seeds: int, topology: str, rows: dict,
                    total: dict) -> None:
    head = ["row", "train steps", "tokens"] + (["TPU-hours"] if topology else [])
    lines = [" | ".join(head)]
    for name, e in list(rows.items()) + [("total", total)]:
        lines.append(" | ".join([name, f"{e['steps']:,}", f"{e['tokens']:.3g}"]
                                + ([_hours(e["tpu_hours"])] if topology else [])))
    print(f"{table.name} at --scale {scale}" + (f" on {topology}" if topology else "")
          + f", {seeds} seed(s); training only (the per-checkpoint evaluations come on top):\n"
          + "\n".join(lines), flush=True)


def estimate(table: str | Table, rows: Sequence[str] = (), tasks: Sequence[str] = (),
             scale: str = "paper", overrides: Sequence[str] = (), seeds: int = 1,
             topology: str = "") -> dict:
    """Steps and tokens of every training stage of the rows (x seeds), and with ``topology``
    the estimated TPU-hours from the AOT compile (chips x expected_step_seconds x steps); prints a
    table; -> {"rows": {row: {...}}, "total": {...}}. Evaluation is not counted."""
    table = as_table(table)
    selected = [table.row(r) for r in rows] if rows else list(table.rows)
    tasks = tuple(tasks) or default_tasks(table, scale)
    check_tasks(tasks)
    cache, out = {}, {}
    for row in selected:
        stages = row_training_stages(table, row, "/estimate", tasks, scale, overrides)
        steps = sum(st.cfg.train.steps - st.start for st in stages) * seeds
        tokens = sum((st.cfg.train.steps - st.start) * flops_lib.tokens_per_step(st.cfg)
                     for st in stages) * seeds
        entry = {"steps": steps, "tokens": tokens}
        if topology:
            seconds = _chip_seconds(table, row.name, stages, topology, cache)
            entry["tpu_hours"] = seconds * seeds / 3600
        out[row.name] = entry
    total = {k: sum(e[k] for e in out.values()) for k in ("steps", "tokens")}
    if topology:
        total["tpu_hours"] = sum(e["tpu_hours"] for e in out.values())
    _print_estimate(table, scale, seeds, topology, out, total)
    return {"rows": out, "total": total}
