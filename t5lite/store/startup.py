"""What a training run writes into its workdir before it trains anything, taken back when it
stops there.

A mistaken command (a bad init_from or task, a mesh that does not fit the model, a NaN at the
first step, Ctrl-C while compiling) must leave the workdir as it found it: otherwise its
config.json makes the corrected command a "config change" to refuse, and empty folders and
TensorBoard files of a run that never trained mislead whoever looks. Only names this run
created are removed, and only those on a short list of start-up files; as soon as anything
shows a step was trained, saved or evaluated, everything stays.
"""

from __future__ import annotations

import os

import jax
from etils import epath

# written at start-up, before any step: the config and the metrics writers' own files
# (TensorBoard's event file, W&B's offline run and the id that resumes it)
START_FILES = ("config.json", "tensorboard", "wandb", "wandb_run.json")
# folders made at start-up that hold saved steps later: removed only while empty
STEP_FOLDERS = ("checkpoints", "data_state")
# written only once a step was logged, saved or evaluated: their presence keeps everything
TRAINED_FILES = ("metrics.jsonl", "goodput.json", "config_history.jsonl")
# (a workdir holding any of these, or a saved step, is never touched: a failed resume keeps
# everything, even a config.json it wrote where there was none)


class StartupWrites:
    """Notes what a workdir holds before a run (`begin`, with the workdir's lock held) and
    removes what the run added if nothing was ever trained there (`undo`); `remove_if_new` removes
    the workdir itself (and the parents made for it) when this run created it and it is empty.
    Process 0 only: the other processes write no start-up files."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.enabled = jax.process_index() == 0
        self.local = "://" not in workdir
        self.new_root = _first_missing(workdir) if self.local else None
        self.before = None

    def begin(self) -> None:
        if not self.enabled:
            return
        try:
            self.before = {p.name for p in epath.Path(self.workdir).iterdir()}
        except FileNotFoundError:  # gs:// has no folder before its first object
            self.before = set()
        except OSError:  # unlistable: nothing is taken back
            self.before = None

    def undo(self) -> None:
        """After a failed run (its checkpointer and writers closed): remove the start-up files
        it added, unless a step was ever logged, saved or evaluated in the workdir. Never
        raises: the run's own error is what the user must see."""
        if self.before is None:
            return
        try:
            root = epath.Path(self.workdir)
            if any((root / name).exists() for name in TRAINED_FILES) or any(
                    (root / name).is_dir() and any((root / name).iterdir())
                    for name in STEP_FOLDERS):
                return  # this run or an earlier one trained here: all of it stays
            new = {p.name for p in root.iterdir()} - self.before
            for name in new & set(START_FILES + STEP_FOLDERS):
                path = root / name
                path.rmtree() if path.is_dir() else path.unlink()
        except OSError:
            pass

    def remove_if_new(self) -> None:
        """After the lock is released: the workdir this run created, and the parent folders
        created with it, are removed while empty (rmdir: never a folder with anything in it)."""
        if self.new_root is None or self.before is None:
            return
        path = os.path.abspath(self.workdir)
        while True:
            try:
                os.rmdir(path)
            except OSError:
                return
            if path == self.new_root:
                return
            path = os.path.dirname(path)


def _first_missing(path: str) -> str | None:
    """The outermost folder of `path` that does not exist yet (None: it all exists)."""
    path, missing = os.path.abspath(path), None
    while not os.path.exists(path):
        missing, parent = path, os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing
