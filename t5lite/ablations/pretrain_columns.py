"""The pretraining columns of a table that reports them (Narang et al. 2021: parameters, steps
per second, the loss early in pretraining and at its end), measured from the pretraining
run's own metrics.jsonl, so they sit beside the paper's in the rendered table."""

from __future__ import annotations

import json
import statistics
from typing import Optional, Sequence

from t5lite.ablations.plan import Stage
from t5lite.errors import UserError

# the paper's early loss: at 65,536 of 524,288 steps
EARLY_FRACTION = 65536 / 524288
# the measured columns, in the paper's order
KEYS = ("pretrain/params_M", "pretrain/steps_per_s", "pretrain/early_loss",
        "pretrain/final_loss")
# cost, not quality: never bold (as the paper's Params / Ops / Step/s), since more parameters
# is no better and a step rate on a shared host measures its load as much as the model
PLAIN_KEYS = ("pretrain/params_M", "pretrain/steps_per_s")


def pretraining_metrics(pre: Stage) -> dict:
    """{"pretrain/params_M", "pretrain/early_loss", "pretrain/final_loss",
    "pretrain/steps_per_s"} of a trained pretraining stage. The losses are held out, as the
    paper's: the eval-split loss logged nearest EARLY_FRACTION of the steps and at the last
    step (the table's pretraining evaluates every 1/8 of its steps: TABLE.pretrain); a run
    that logged no eval loss gives its training loss there instead. Steps per second: the
    median logged after the first interval (which holds the compile)."""
    from t5lite import models
    from t5lite.monitor.plot import read_metrics
    out = {"pretrain/params_M": models.count_params(pre.cfg.model) / 1e6}
    metrics = read_metrics(pre.workdir)
    train = [r for r in metrics.get("train", []) if "loss" in r]
    losses = [r for r in metrics.get("eval", []) if "loss" in r] or train
    if losses:
        early = pre.cfg.train.steps * EARLY_FRACTION
        out["pretrain/early_loss"] = float(
            min(losses, key=lambda r: abs(r["step"] - early))["loss"])
        out["pretrain/final_loss"] = float(losses[-1]["loss"])
    rates = [r["steps_per_s"] for r in train[1:] if "steps_per_s" in r]
    if rates:
        out["pretrain/steps_per_s"] = float(statistics.median(rates))
    return out


def read_compile_log(path: str) -> list:
    """The JSON lines of a compile log (bench/modifications_compile.py writes them; local or
    gs://); a line cut short by a killed run is skipped."""
    from etils import epath
    p = epath.Path(path)
    if not p.exists():
        raise UserError(f"--compiled {path}: no such file (bench/modifications_compile.py "
                        "writes one, e.g. bench/modifications_compile.jsonl).")
    out = []
    for text in p.read_text().splitlines():
        try:
            out.append(json.loads(text))
        except ValueError:
            continue
    return out


def compiled_lines(lines: Sequence[dict], topology: str, stage: str = "pretrain") -> dict:
    """{row: its last line} of a compile log (bench/modifications_compile.py's JSON lines) for
    ``topology`` and ``stage`` compiled as the table plans it (no extra --set): a later line
    of a row replaces an earlier one (a retried compile)."""
    return {x["row"]: x for x in lines if x.get("topology") == topology
            and x.get("stage") == stage and not x.get("extra")}


def fitted_lines(lines: Sequence[dict]) -> list:
    """The lines of stages compiled as the table plans them, each one that does not fit
    replaced by the figures of the same row, stage and topology compiled with extra overrides
    that fit (the last such line, e.g. micro-batches: a recompile supersedes an older one),
    still keyed as the plan's stage and naming those overrides in ``fitted_with``; the
    estimate then costs the row as it can run. A stage with no fitting variant stays as it
    is (does not fit)."""
    out = []
    for x in lines:
        if x.get("extra") or x.get("fits", True) or "error" in x:
            if not x.get("extra"):
                out.append(x)
            continue
        fit = next((v for v in reversed(lines) if v.get("extra") and v.get("fits") and all(
            v.get(k) == x.get(k) for k in ("row", "stage", "topology", "scan_unroll"))), None)
        out.append(x if fit is None else dict(
            fit, config=x["config"], overrides=x["overrides"], extra=[],
            fitted_with=fit["extra"], plan_peak_gib_per_chip=x["peak_gib_per_chip"]))
    return out


def _cell(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _compiled_cells(line: dict, base: Optional[dict]) -> list:
    """fits / peak / Ops / forward MACs / step/s / x baseline cells of one compiled row."""
    if "error" in line:
        return ["error", "-", "-", "-", "-", "-", "-"]
    step = line.get("expected_step_seconds")
    rate = 1 / step if step else None
    roof = line.get("roofline_step_seconds")
    base_step = (base or {}).get("expected_step_seconds")
    ratio = base_step / step if step and base_step else None
    ops = line.get("ops_T")
    fits = "yes" if line["fits"] else "**no**"
    if line.get("fitted_with"):
        fits = (f"no ({line['plan_peak_gib_per_chip']:.2f}); with "
                + ", ".join(line["fitted_with"]))
    return [fits, f"{line['peak_gib_per_chip']:.2f}",
            _cell(ops, ".1f"), _cell(ops / 6 if ops is not None else None, ".1f"),
            _cell(rate, ".2f"),
            _cell(1 / roof if roof else None, ".2f"), _cell(ratio, ".2f")]


def compiled_table(table, lines: Sequence[dict], topology: str) -> str:
    """A markdown table of the rows compiled for ``topology``, in the table's order: fits,
    peak GiB per chip, compiled Ops (the matmul FLOPs of one training step over all chips,
    T) and a sixth of it (the forward pass's multiply-accumulates when the step is forward +
    backward = 3 forwards, no remat: the paper's Ops reads as that, Mesh TensorFlow's one-hot
    embedding matmuls included) beside the paper's Ops, expected and roofline steps per
    second beside the paper's Step/s, and both step rates relative to the baseline row (the
    paper measured on other hardware: the ratios are what compares). Rows not compiled are
    left out; a failed compile says "error"."""
    rows = compiled_lines(lines, topology)
    base = rows.get(table.baseline)
    base_paper = dict(zip(table.paper_columns, table.row(table.baseline).paper))
    head = ["Row", "scanned", "fits", "peak GiB / chip", "Ops (T)", "Ops / 6", "paper Ops (T)",
            "step/s expected", "step/s roofline", "paper Step/s", "x base (expected)",
            "x base (paper)"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in table.rows:
        if row.name not in rows:
            continue
        line, paper = rows[row.name], dict(zip(table.paper_columns, row.paper))
        scanned = "/".join("scan" if s else "unrolled"
                           for s in line.get("scanned", {}).values()) or "-"
        cells = _compiled_cells(line, base)
        paper_ratio = paper["Step/s"] / base_paper["Step/s"]
        out.append("| " + " | ".join(
            [row.label[0], scanned] + cells[:4] + [f"{paper['Ops (T)']:.1f}"] + cells[4:6]
            + [f"{paper['Step/s']:.2f}", cells[6], f"{paper_ratio:.2f}"]) + " |")
    return "\n".join(out)
