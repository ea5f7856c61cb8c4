"""`t5lite models` and `t5lite tasks list`, in seconds and without TensorFlow.

The model table traces each config's parameter shapes with jax.eval_shape (one layer per stack,
models.layerwise_counts); the task table reads t5lite/task_catalog.py, which needs no seqio.
Whether a task's data is prepared is a file check (dataprep.is_prepared).
"""

from __future__ import annotations

import difflib
import fnmatch
import textwrap
from typing import Optional

from t5lite.errors import UserError
from t5lite.text_table import format_table


def dataset_names() -> list[str]:
    from t5lite import dataprep
    return list(dataprep.DATASETS)


def models_table(names=()) -> str:
    from t5lite.models import param_count_table
    return param_count_table(list(names) or None)


def tasks_table(pattern: str = "", width: Optional[int] = None, task_modules=()) -> str:
    """task_catalog.rows() with a `data` column: ready, or the datasets to prepare.

    ``pattern``: only the names that contain it, or match it as a glob (``paper_*``).
    ``width``: fold the table into this many columns (a terminal's): a mixture's members
    become their count and the first names, long cells end in "…"; None prints every cell.
    ``task_modules``: also the tasks these modules register (data.task_modules entries;
    imports seqio and TensorFlow), whose data cell says whether their files exist."""
    from t5lite import dataprep, task_catalog
    status = {}

    def data(needs):
        missing = []
        for n in needs:
            if n not in status:
                status[n] = dataprep.is_prepared(n)
            if not status[n]:
                missing.append(n)
        return "ready" if not missing else "prepare " + ",".join(missing)

    user = {}
    if task_modules:
        from t5lite.tasks import registered, user_modules
        user_modules.import_modules(task_modules)
        user = registered.user_rows()
    rows = _matching(task_catalog.rows() + [row for row, _ in user.values()], pattern)
    table = [["name", "kind", "features", "vocabulary", "metrics/members", "data"]]
    for r in rows:
        cells = r.cells() + [user[r.name][1] if r.name in user
                             else data(r.needs) if r.needs else "-"]
        if width is not None and r.members:
            cells[4] = f"{len(r.members)}: " + ", ".join(r.members)
        table.append(cells)
    if width is not None:
        # columns: name kind features vocabulary members data; the name stays whole
        table = _fit(table, width, shrink={2: 14, 4: 14, 5: 10}, drop=(2, 3, 1))
    note = (f"data: prepared under {dataprep.data_dir()}; build what is missing with "
            "`t5lite data prepare NAME ...`.")
    return format_table(table) + "\n" + (textwrap.fill(note, width) if width else note)


def _matching(rows, pattern: str) -> list:
    """The rows whose name contains ``pattern`` (or matches it, for a glob); an error naming
    the closest names when none does."""
    if not pattern:
        return list(rows)
    glob = any(c in pattern for c in "*?[")
    found = [r for r in rows if (fnmatch.fnmatchcase(r.name, pattern) if glob
                                 else pattern in r.name)]
    if not found:
        hint = difflib.get_close_matches(pattern, [r.name for r in rows], n=3)
        raise UserError(f"no task or mixture matches {pattern!r}." + (
            f" Did you mean: {', '.join(hint)}?" if hint else
            " Run `t5lite tasks list` without a filter to see them all."))
    return found


def _fit(table: list, width: int, shrink: dict, drop: tuple = ()) -> list:
    """``table`` cut to ``width`` columns (two spaces between): the widest of the ``shrink``
    columns ({index: narrowest}) lose their cells' ends (marked "…") first; if that is not
    enough the ``drop`` columns go, in that order (--wide shows them)."""
    table = [list(r) for r in table]
    shrink, drop = dict(shrink), list(drop)
    while True:
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        excess = sum(widths) + 2 * (len(widths) - 1) - width
        floors = {i: min(widths[i], max(n, len(table[0][i]))) for i, n in shrink.items()}
        if excess <= sum(widths[i] - floors[i] for i in shrink) or not drop:
            break
        gone = drop.pop(0)
        table = [r[:gone] + r[gone + 1:] for r in table]
        shrink = {i - (i > gone): n for i, n in shrink.items() if i != gone}
        drop = [i - (i > gone) for i in drop]
    while excess > 0 and any(widths[i] > floors[i] for i in shrink):  # the widest gives
        widest = max((i for i in shrink if widths[i] > floors[i]), key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return [[c if len(c) <= widths[i] else c[:widths[i] - 1] + "…" for i, c in enumerate(r)]
            for r in table]
