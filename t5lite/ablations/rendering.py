"""A table's results as markdown (WORKDIR/<table>/table.md, measured beside the paper's
numbers) and as a chart (table.png)."""

from __future__ import annotations

from typing import Optional

from t5lite.ablations.files import join_path, read_json, row_dir
from t5lite.ablations.paper import DOWNSTREAM
from t5lite.ablations.pretrain_columns import KEYS as PRETRAIN_KEYS, PLAIN_KEYS
from t5lite.ablations.tables import Row, Table


def _metric_header(key: str) -> str:
    task, _, metric = key.partition("/")
    return f"{task} {metric}"


def _bold_set(values: dict, std: float) -> set:
    """Rows within two standard deviations of the best (the paper's rule); std 0 or unknown:
    the best value(s) only."""
    if not values:
        return set()
    best = max(values.values())
    return {r for r, v in values.items() if v >= best - 2 * std - 1e-12}


def _fmt(x: float, bold: bool, spread: Optional[float] = None, decimals: int = 2) -> str:
    cell = f"{x:.{decimals}f}" + (f" ± {spread:.{decimals}f}" if spread is not None else "")
    return f"**{cell}**" if bold else cell


def _metric_keys(done: dict) -> list[str]:
    """The measured columns: each DOWNSTREAM task's metrics in DOWNSTREAM's order, then any
    other metric (not a benchmark member's: those are in its average)."""
    present = {k for res in done.values() for k in res["metrics"]
               if not k.endswith("/checkpoint_step")}
    keys = [k for k in PRETRAIN_KEYS if k in present]
    keys += [k for d in DOWNSTREAM.values() for k in d.metrics if k in present]
    keys += sorted(k for k in present if k not in keys and k.split("/")[0] not in DOWNSTREAM
                   and not any(k.startswith(m + "/") for d in DOWNSTREAM.values()
                               for m in d.members))
    return keys


def _bold_rows(table: Table, done: dict, keys: list[str], paper_rows: list[Row]) -> dict:
    """{column: the rows printed bold}: measured columns by the baseline's spread over seeds
    (else the rows' mean spread), the paper's by its Table 1 baseline spread."""
    bold = {}
    for k in keys:
        vals = {n: res["metrics"][k] for n, res in done.items() if k in res["metrics"]}
        stds = {n: res.get("std", {}).get(k, 0.0) for n, res in done.items()
                if len(res.get("runs", {})) > 1}
        spread = stds.get(table.baseline) if table.baseline in stds else (
            sum(stds.values()) / len(stds) if stds else 0.0)
        if k in PLAIN_KEYS:
            bold[k] = set()
        elif k.endswith("loss"):  # less is better: the best is the largest negated loss
            bold[k] = _bold_set({n: -v for n, v in vals.items()}, spread)
        else:
            bold[k] = _bold_set(vals, spread)
    for i, c in enumerate(table.paper_columns):
        vals = {r.name: r.paper[i] for r in paper_rows if r.paper[i] is not None}
        bold[c] = (_beats_baseline(table, vals, c) if table.bold_vs_baseline
                   else _bold_set(vals, table.paper_std[i]))
    return bold


def _beats_baseline(table: Table, values: dict, column: str) -> set:
    """The rows better than the baseline row in ``column`` (lower_is_better: smaller)."""
    if table.baseline not in values or column in table.plain_columns:
        return set()
    base, sign = values[table.baseline], -1 if column in table.lower_is_better else 1
    return {r for r, v in values.items() if r != table.baseline and sign * (v - base) > 1e-12}


def _row_line(table: Table, row: Row, res: Optional[dict], keys: list[str], bold: dict,
              with_paper: bool) -> str:
    label = list(row.label)
    label[0] = ("★ " if row.name == table.baseline else "") + label[0]
    cells = []
    for k in keys:
        if res is None or k not in res["metrics"]:
            cells.append("–")
            continue
        several = len(res.get("runs", {})) > 1
        cells.append(_fmt(res["metrics"][k], row.name in bold[k],
                          res.get("std", {}).get(k, 0.0) if several else None))
    if with_paper:
        cells += ["–" if row.paper is None or row.paper[i] is None
                  else _fmt(row.paper[i], row.name in bold[c],
                            decimals=dict(table.paper_decimals).get(c, 2))
                  for i, c in enumerate(table.paper_columns)]
    return "| " + " | ".join(label + cells) + " |"


def _notes(table: Table, done: dict, missing: list[str], with_paper: bool) -> list[str]:
    n_seeds = max([len(res.get("runs", {})) or 1 for res in done.values()] or [1])
    scales = sorted({res.get("scale", "?") for res in done.values()})
    splits = sorted({res.get("split", "test") for res in done.values()})
    notes = [f"Scale: {', '.join(scales) or '-'}; measured on the {', '.join(splits) or '-'} "
             f"split" + (f", mean ± std over {n_seeds} seeds" if n_seeds > 1 else ", one seed")
             + "; ★ = the paper's baseline; bold = within two standard deviations of the "
             "column's best (the paper's rule)."]
    if with_paper and table.paper_source:
        notes.append(table.paper_source
                     + (f" {table.paper_note}" if table.paper_note else ""))
    elif with_paper:
        notes.append("Paper: arXiv 1910.10683v4, its validation-set numbers (GLUE and SuperGLUE "
                     "averages, CNN/DM ROUGE-2-F, SQuAD, WMT BLEU); bold by its Table 1 "
                     "baseline spread."
                     + (f" {table.paper_note}" if table.paper_note else ""))
    if missing:
        notes.append(f"Not run yet: {', '.join(missing)}.")
    return notes


def render(table: Table, workdir: str) -> str:
    """Markdown: each row's measured metrics (mean ± std over seeds where several ran) beside
    the paper's published numbers; ★ the paper's baseline; bold = within two standard
    deviations of the column's best (measured: the baseline's spread over seeds, else the
    rows' mean spread; paper: its Table 1 baseline spread)."""
    found = [(r, read_json(join_path(row_dir(workdir, table, r), "result.json")))
             for r in table.rows]
    done = {r.name: res for r, res in found if res}
    keys = _metric_keys(done)
    paper_rows = [r for r in table.rows if r.paper is not None]
    header = list(table.label_columns) + [_metric_header(k) for k in keys]
    if paper_rows:
        header += [f"{c} (paper)" for c in table.paper_columns]
    lines = [f"**{table.name}**: {table.caption}", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    bold = _bold_rows(table, done, keys, paper_rows)
    lines += [_row_line(table, r, done.get(r.name), keys, bold, bool(paper_rows))
              for r in table.rows if r.name in done or r.paper is not None]
    missing = [r.name for r, res in found if not res]
    return "\n".join(lines + [""] + _notes(table, done, missing, bool(paper_rows)))


def write_table(table: Table, workdir: str) -> str:
    """Write WORKDIR/<table>/table.md (render) and table.png (the same numbers as a chart);
    -> the markdown file's path."""
    import jax
    from etils import epath
    path = join_path(workdir, table.name, "table.md")
    if jax.process_index() == 0:
        epath.Path(path).write_text(render(table, workdir) + "\n")
        from t5lite.monitor import plot
        results = [(r, read_json(join_path(workdir, table.name, r.name, "result.json")) or {})
                   for r in table.rows]
        plot.ablation_chart(f"{table.name}: {table.caption}", [
            (" ".join(r.label), res.get("metrics", {}), r.name == table.baseline)
            for r, res in results], join_path(workdir, table.name, "table.png"))
    return path
