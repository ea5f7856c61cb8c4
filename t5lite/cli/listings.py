"""`t5lite models` and `t5lite tasks list`, in seconds and without TensorFlow.

The model table traces each config's parameter shapes with jax.eval_shape (one layer per stack,
models.layerwise_counts); the task table reads t5lite/task_catalog.py, which needs no seqio.
Whether a task's data is prepared is a file check (dataprep.is_prepared).
"""

from __future__ import annotations

from t5lite.text_table import format_table


def dataset_names() -> list[str]:
    from t5lite import dataprep
    return list(dataprep.DATASETS)


def models_table(names=()) -> str:
    from t5lite.models import param_count_table
    return param_count_table(list(names) or None)


def tasks_table() -> str:
    """task_catalog.rows() with a `data` column: ready, or the datasets to prepare."""
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

    table = [["name", "kind", "features", "vocabulary", "metrics / members", "data"]]
    table += [r.cells() + [data(r.needs) if r.needs else "-"] for r in task_catalog.rows()]
    return (format_table(table) + f"\ndata: prepared under {dataprep.data_dir()}; build what "
            "is missing with `t5lite data prepare NAME ...`.")
