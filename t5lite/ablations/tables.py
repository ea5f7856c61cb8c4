"""A paper table as data (Table of Rows) and the table files configs/ablations/*.py."""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Optional

from t5lite import config as config_lib
from t5lite.config import python_files
from t5lite.ablations.paper import PAPER_BASELINE_STD, PAPER_COLUMNS
from t5lite.errors import UserError


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a paper table. ``label``: the paper's text, one entry per label column."""

    name: str  # id: `--rows NAME`, the directory WORKDIR/<table>/<name>
    label: tuple
    pretrain: tuple = ()  # overrides of the pretraining stage
    finetune: tuple = ()  # overrides of every finetuning stage
    both: tuple = ()  # overrides of both stages (the model: architecture, sizes, ...)
    multitask: bool = False  # no finetuning: evaluate the pretrained (multi-task) params
    pretrained: bool = True  # False: finetune from random params (the paper's Table 1 row)
    # Table 12: pretrain once per downstream task, on the row's pretraining mixture without
    # that task (<mixture>_without_<task>), then finetune on it
    leave_one_out: bool = False
    # Table 13: this many members, each pretrained and finetuned with its own seed (or, with
    # shared_pretraining, finetuned from one pretrained model), evaluated as one ensemble
    ensemble: int = 0
    shared_pretraining: bool = False
    # the paper's numbers, one per the table's paper_columns (None = unknown)
    paper: Optional[tuple] = None


@dataclasses.dataclass(frozen=True)
class Table:
    name: str  # "table6": the file configs/ablations/table6.py, the directory WORKDIR/table6
    caption: str  # the paper's caption (shortened)
    label_columns: tuple  # header(s) of the label column(s), e.g. ("Corruption rate",)
    rows: tuple
    baseline: str = ""  # the row marked ★ (the paper's baseline); "" = none
    pretrain_config: str = "quickstart"
    pretrain: tuple = ()  # overrides of every row's pretraining stage
    finetune: tuple = ()  # ... and finetuning stages
    tasks: tuple = ("sentiment",)  # default downstream tasks (keys of DOWNSTREAM)
    paper_note: str = ""  # caveats about the paper's published numbers
    # The paper's columns and how they are bolded. The T5 tables: PAPER_COLUMNS, bold within
    # two of the Table 1 baseline's standard deviations of the best; a table from another
    # paper names its own columns, and with bold_vs_baseline bolds what beats the baseline
    # row (lower_is_better: the columns where less is better, e.g. a loss)
    paper_columns: tuple = PAPER_COLUMNS
    paper_std: tuple = PAPER_BASELINE_STD
    paper_source: str = ""  # "" = the T5 paper's note under the rendered table
    bold_vs_baseline: bool = False
    lower_is_better: tuple = ()
    plain_columns: tuple = ()  # paper columns never bolded (cost: parameters, speed)
    paper_decimals: tuple = ()  # ((column, decimals), ...) where not 2
    # measure the pretraining run's parameters, steps/s and early / final loss too
    # (ablations/pretrain_columns.py)
    pretrain_columns: bool = False
    # per scale: (pretraining, finetuning) overrides after the table's own, e.g. the paper's
    # finetuning learning rate at --scale paper only
    scale_overrides: tuple = ()  # ((scale, (pretrain overrides), (finetune overrides)), ...)
    scale_tasks: tuple = ()  # ((scale, tasks), ...): the default tasks there (before Scale's)

    def __post_init__(self):
        names = [r.name for r in self.rows]
        if len(set(names)) != len(names):
            raise UserError(f"{self.name}: duplicate row names in {names}")
        if self.baseline and self.baseline not in names:
            raise UserError(f"{self.name}: baseline {self.baseline!r} is not a row")
        for r in self.rows:
            if r.paper is not None and len(r.paper) != len(self.paper_columns):
                raise UserError(f"{self.name}/{r.name}: paper numbers need one per column "
                                f"{self.paper_columns}")
            if (r.leave_one_out or r.ensemble) and (r.multitask or not r.pretrained):
                raise UserError(f"{self.name}/{r.name}: leave-one-out and ensemble rows "
                                "pretrain and finetune (not multitask, not pretrained=False)")
            if len(r.label) != len(self.label_columns):
                raise UserError(f"{self.name}/{r.name}: label {r.label} needs "
                                f"{len(self.label_columns)} entries ({self.label_columns})")

    def scale_layers(self, scale: str, stage: str) -> tuple:
        """This table's own overrides of ``stage`` ("pretrain" / "finetune") at ``scale``."""
        for name, pre, fine in self.scale_overrides:
            if name == scale:
                return tuple(pre if stage == "pretrain" else fine)
        return ()

    def default_tasks(self, scale: str) -> tuple:
        """The table's own downstream tasks at ``scale`` (() = none named there)."""
        return next((tuple(t) for name, t in self.scale_tasks if name == scale), ())

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise UserError(f"{self.name} has no row {name!r}."
                        + did_you_mean(name, [r.name for r in self.rows])
                        + f" Rows: {', '.join(r.name for r in self.rows)}.")


def tables_dir() -> str:
    return os.path.join(config_lib.configs_dir(), "ablations")


def table_names() -> list[str]:
    names = [f[:-3] for f in os.listdir(tables_dir())
             if f.endswith(".py") and not f.startswith("_")]
    return sorted(names, key=lambda n: (len(n), n))


def load_table(name: str) -> Table:
    """`table6`, `6`, `modifications` (a file's name in configs/ablations/), or a path to a
    file defining TABLE."""
    path = name if name.endswith(".py") and os.path.isfile(name) else os.path.join(
        tables_dir(), name + ".py")
    if not os.path.isfile(path) and not name.endswith(".py"):
        path = os.path.join(tables_dir(), f"table{name}.py")
    if not os.path.isfile(path):
        raise UserError(f"no ablation table {name!r}." + did_you_mean(name, table_names())
                        + f" Tables: {', '.join(table_names())} (`t5lite ablate --list`).")
    module = python_files.load(path, "t5lite_ablation_" + os.path.basename(path)[:-3])
    if not isinstance(getattr(module, "TABLE", None), Table):
        raise UserError(f"{path} must define TABLE = t5lite.ablations.Table(...)")
    return module.TABLE


def as_table(table: str | Table) -> Table:
    """A Table, or the name / path of one (load_table)."""
    return table if isinstance(table, Table) else load_table(table)


def list_tables() -> str:
    lines = []
    for name in table_names():
        t = load_table(name)
        lines.append(f"{t.name}: {t.caption}")
        for r in t.rows:
            star = "★ " if r.name == t.baseline else "  "
            lines.append(f"  {star}{r.name:<22} {' | '.join(r.label)}")
    return "\n".join(lines)


def did_you_mean(name, known) -> str:
    """The hint " Did you mean: a, b?" naming the ``known`` names close to ``name``, or ""."""
    hint = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    return f" Did you mean: {', '.join(hint)}?" if hint else ""
