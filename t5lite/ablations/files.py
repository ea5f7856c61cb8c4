"""Where a study's files live (WORKDIR/<table>/<row>[/seed<k>]/...) and how its JSON files are
read and written (local paths or gs://)."""

from __future__ import annotations

import json
from typing import Optional

from t5lite.ablations.tables import Row, Table


def join_path(*parts) -> str:
    """Join path parts with "/" (gs:// paths too), dropping trailing slashes of the parts."""
    return "/".join(p.rstrip("/") for p in parts)


def row_dir(workdir: str, table: Table, row: Row, seed: int = 0) -> str:
    """WORKDIR/<table>/<row> for seed 0, .../<row>/seed<k> for the others."""
    d = join_path(workdir, table.name, row.name)
    return d if seed == 0 else join_path(d, f"seed{seed}")


def read_json(path: str) -> Optional[dict]:
    """The file's JSON, or None when there is no such file."""
    from etils import epath
    p = epath.Path(path)
    return json.loads(p.read_text()) if p.exists() else None


def write_json(path: str, obj) -> None:
    """Write ``obj`` as JSON (process 0 only: one writer per file in a multi-process job)."""
    import jax
    from etils import epath
    if jax.process_index() == 0:
        epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
        epath.Path(path).write_text(json.dumps(obj, indent=2))
