"""`t5lite train --resume-from S`: the checkpoints after step S leave the workdir's
checkpoints/ (and data_state/) for WORKDIR/set_aside/<UTC time>/, so the run resumes from S.
They are moved, never deleted (no checkpoint that existed is lost): moving them back restores
the workdir as it was. Local or gs:// (GCS renames nothing: gcs.move copies, then deletes).
"""

from __future__ import annotations

import time

from etils import epath

from t5lite.errors import UserError
from t5lite.store import gcs

PARTS = ("checkpoints", "data_state")


def saved_steps(workdir: str) -> list[int]:
    """The steps of WORKDIR/checkpoints/<step> (orbax's in-flight and renamed folders aside)."""
    root = epath.Path(workdir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())


def check_step(workdir: str, step: int) -> list[int]:
    """-> the saved steps after ``step``; a step that is not a saved checkpoint is a
    UserError naming the saved ones (checked on every process before anything moves)."""
    steps = saved_steps(workdir)
    if step not in steps:
        raise UserError(
            f"--resume-from {step}: {workdir}/checkpoints has no step {step}; saved steps: "
            + (", ".join(map(str, steps)) if steps else "none (nothing to resume from)"))
    return [s for s in steps if s > step]


def set_aside_after(workdir: str, step: int) -> str:
    """Move every checkpoint (and its data state) after ``step`` to WORKDIR/set_aside/<UTC
    time>/{checkpoints,data_state}/<step>. -> the line saying what moved where."""
    later = check_step(workdir, step)
    if not later:
        return f"--resume-from {step}: it is the newest checkpoint; nothing set aside"
    dest = epath.Path(workdir) / "set_aside" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for s in later:
        for part in PARTS:
            src = epath.Path(workdir) / part / str(s)
            if src.exists():
                _move(src, dest / part / str(s))
    if gcs.is_gcs(workdir):
        _forget_listings(workdir)
    return (f"--resume-from {step}: set aside checkpoint{'s' * (len(later) > 1)} "
            f"{', '.join(map(str, later))} (with {'their' if len(later) > 1 else 'its'} data "
            f"state) -> {dest}; move them back to undo")


def _forget_listings(workdir: str) -> None:
    """Every gcsfs instance that may have listed the workdir drops its listings: epath keeps
    its own filesystem object (orbax lists steps through it), which need not be the one in
    fsspec's instance cache any more, so both are refreshed."""
    import gcsfs
    from etils.epath import backend
    backend.fsspec_backend.fs(workdir).invalidate_cache()
    for fs in list(getattr(gcsfs.GCSFileSystem, "_cache", {}).values()):
        fs.invalidate_cache()


def _move(src, dst) -> None:
    if gcs.is_gcs(src):
        gcs.move(src, dst)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.rename(dst)
