"""`t5lite plot`: training curves from metrics.jsonl as a PNG (several runs overlaid), and the
bar chart that `t5lite ablate` writes next to table.md. matplotlib, Agg backend (no display).

Panels: loss (train, smoothed, and eval), accuracy (train and eval), learning rate, and the
task metrics of evaluation during training (seqio metrics, e.g. sentiment/accuracy).
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from t5lite.errors import UserError

DPI = 100


def parse_size(size: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in size.lower().split("x"))
    except ValueError:
        w = h = 0
    if not (200 <= w <= 8000 and 200 <= h <= 8000):
        raise UserError(f"--size {size!r}: give WIDTHxHEIGHT in pixels, each 200-8000, e.g. "
                        "1400x900.")
    return w, h


def read_metrics(workdir: str) -> dict[str, list[dict]]:
    """metrics.jsonl -> {split: [records sorted by step]} (train, eval, eval_tasks, goodput)."""
    from etils import epath
    path = epath.Path(workdir) / "metrics.jsonl"
    if not path.exists():
        raise UserError(f"{path} does not exist: give a `t5lite train` workdir (it writes "
                        "metrics.jsonl as it trains).")
    by_split: dict[str, dict[int, dict]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:  # a line cut short by a killed run
            continue
        by_split.setdefault(rec.get("split", "train"), {})[rec.get("step", 0)] = rec
    return {k: [v[s] for s in sorted(v)] for k, v in by_split.items()}


def run_labels(workdirs: Sequence[str]) -> list[str]:
    """Short, distinct names: the path parts that differ between the workdirs."""
    parts = [os.path.normpath(w).split(os.sep) for w in workdirs]
    if len(parts) == 1:
        return [os.sep.join(parts[0][-2:])]
    lead = 0
    while all(len(p) > lead + 1 for p in parts) and len({p[lead] for p in parts}) == 1:
        lead += 1
    return [os.sep.join(p[lead:]) for p in parts]


def _smooth(values, window: int):
    """Centered moving average (shorter windows at the ends): no lag, unlike an EMA."""
    import numpy as np
    v = np.asarray(values, float)
    kernel = np.ones(window)
    return np.convolve(v, kernel, "same") / np.convolve(np.ones_like(v), kernel, "same")


def _series(records, key):
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _figure(width: int, height: int, rows: int, cols: int):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 11, "axes.titlesize": 13, "legend.fontsize": 9})
    fig, axes = plt.subplots(rows, cols, figsize=(width / DPI, height / DPI), dpi=DPI,
                             squeeze=False)
    return plt, fig, axes


def _plot_curves(ax, train, ev, key, color, label) -> None:
    """A training metric per step (noisy values faint under their moving average) and its
    eval points."""
    x, y = _series(train, key)
    if x:
        smooth = len(x) > 20
        if smooth:
            ax.plot(x, y, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(x, _smooth(y, max(3, len(y) // 25) | 1) if smooth else y, color=color,
                linewidth=1.8, label=f"{label} train")
    x, y = _series(ev, key)
    if x:
        ax.plot(x, y, color=color, linestyle="--", marker="o", markersize=4,
                label=f"{label} eval")


def _plot_run(axes, run, label, color, task_keys, many_runs: bool) -> None:
    """One run's loss, accuracy, learning rate and task metrics onto the four panels."""
    ax_loss, ax_acc, ax_lr, ax_task = axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]
    train, ev = run.get("train", []), run.get("eval", [])
    _plot_curves(ax_loss, train, ev, "loss", color, label)
    _plot_curves(ax_acc, train, ev, "accuracy", color, label)
    x, y = _series(train, "lr")
    if x:
        ax_lr.plot(x, y, color=color, linewidth=1.8, label=label)
    styles = ["-", "--", ":", "-."]
    for j, key in enumerate(task_keys):
        x, y = _series(run.get("eval_tasks", []), key)
        if x:
            ax_task.plot(x, y, color=color, linestyle=styles[j % len(styles)], marker="o",
                         markersize=4, label=f"{label} {key}" if len(task_keys) > 1 or
                         many_runs else key)


def _finish_axes(axes) -> None:
    """Titles, labels and legends; an empty panel says so instead of showing blank axes."""
    from matplotlib.ticker import MaxNLocator
    titles = ((axes[0, 0], "loss", "cross entropy"), (axes[0, 1], "token accuracy", "accuracy"),
              (axes[1, 0], "learning rate", "lr"),
              (axes[1, 1], "task metrics (evaluation during training)", "value"))
    for ax, title, ylabel in titles:
        ax.set_title(title)
        if ax.lines:
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, not 2.5
            ax.grid(True, alpha=0.3)
            ax.legend(loc="best")
        else:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes,
                    color="gray", fontsize=12)
    axes[1, 0].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))


def plot_runs(workdirs: Sequence[str], output: str, size: str = "1400x900",
              labels: Sequence[str] = ()) -> str:
    """Render the runs' curves into one PNG at `output` (size WxH pixels) -> output."""
    if not workdirs:
        raise UserError("`t5lite plot` needs at least one workdir.")
    width, height = parse_size(size)
    runs = [read_metrics(w) for w in workdirs]
    labels = list(labels) or run_labels(workdirs)
    plt, fig, axes = _figure(width, height, 2, 2)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    task_keys = sorted({k for run in runs for r in run.get("eval_tasks", ())
                        for k in r if "/" in k})
    for i, (run, label) in enumerate(zip(runs, labels)):
        _plot_run(axes, run, label, colors[i % len(colors)], task_keys, len(runs) > 1)
    _finish_axes(axes)
    fig.suptitle(", ".join(labels) if len(labels) <= 4 else f"{len(labels)} runs",
                 fontsize=14)
    fig.tight_layout()
    _save(fig, plt, output)
    return output


def _save(fig, plt, output: str) -> None:
    from etils import epath
    out = epath.Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f:  # epath: the output may be gs://
        fig.savefig(f, format="png", dpi=DPI)
    plt.close(fig)


def ablation_chart(title: str, rows: Sequence[tuple[str, dict, bool]], output: str,
                   size: str = "1200x700") -> str | None:
    """One panel per metric (each its own scale), one bar per row: rows are (label,
    {metric: value}, is_baseline). -> output, or None when no row has a metric yet."""
    rows = [r for r in rows if r[1]]
    keys = sorted({k for _, metrics, _ in rows for k in metrics})
    if not keys:
        return None
    width, height = parse_size(size)
    plt, fig, axes = _figure(width, height, 1, len(keys))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = [("★ " if baseline else "") + label for label, _, baseline in rows]
    for ax, key in zip(axes[0], keys):
        ys = [metrics.get(key, float("nan")) for _, metrics, _ in rows]
        bars = ax.bar(range(len(rows)), ys, 0.8,
                      color=[colors[i % len(colors)] for i in range(len(rows))],
                      edgecolor=["black" if b else "none" for _, _, b in rows], linewidth=1.5)
        ax.bar_label(bars, fmt="%.2f", fontsize=9, padding=2)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, rotation=30 if len(rows) > 3 else 0, ha="right"
                           if len(rows) > 3 else "center")
        ax.set_title(key.replace("/", " "))
        ax.grid(True, axis="y", alpha=0.3)
        ax.margins(y=0.12)
    axes[0, 0].set_ylabel("held-out test value")
    fig.suptitle(title + "   (★ = the paper's baseline)", fontsize=13)
    fig.tight_layout()
    _save(fig, plt, output)
    return output
