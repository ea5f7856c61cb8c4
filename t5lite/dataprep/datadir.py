"""The data directory: where prepared data lives (CONTRACTS.md "Tasks and data").

`data_dir()` resolves it for every reader; `use_data_dir()` is the one function that sets it for
the process; `require()` locates one prepared file.
"""

from __future__ import annotations

import os

from t5lite.errors import UserError

ENV = "T5LITE_DATA_DIR"
# Set on machines that never build data, only receive it (TPU workers: launch/tpu_job.sh sets
# it, since registry downloads need tools their images lack): the command, run elsewhere, that
# copies datasets here. Missing data is then a UserError naming it, never a download.
FROM_ENV = "T5LITE_DATA_FROM"


def data_dir(override: str = "") -> str:
    """override, else $T5LITE_DATA_DIR, else ~/.cache/t5lite (CONTRACTS.md). A local path:
    preparation writes with local file operations and the readers (seqio text sources,
    SentencePiece files, line counts) open local files, so a URL is a UserError here rather
    than a path that fails later under a mangled name."""
    d = override or os.environ.get(ENV, "") or os.path.join(
        os.path.expanduser("~"), ".cache", "t5lite")
    if "://" in d:
        raise UserError(f"the data dir {d} is a URL: prepared data must be on a local disk "
                        "(set data.data_dir / $T5LITE_DATA_DIR to a local path; TPU workers get "
                        "theirs with `python launch/tpu_vm.py data`; TFDS data in "
                        "$TFDS_DATA_DIR may be on GCS).")
    return os.path.abspath(os.path.expanduser(d))


def use_data_dir(override: str = "") -> None:
    """Makes ``override`` (when given) the data dir of this process.

    seqio tasks are registered once per process, and their sources and vocabularies locate
    their files when a dataset is built (registry.LocalTextLineSource, vocabularies.py), not
    when they are registered: they cannot be handed the directory, so they read it through
    data_dir() from $T5LITE_DATA_DIR. This is the one writer of that variable; each entry point
    that is given a data dir (the CLI's `data` command, trainer.train, evaluation.load,
    pipeline.get_dataset) calls it once. A URL (gs://...) is a UserError (data_dir), raised
    here, before any training starts.
    """
    if override:
        os.environ[ENV] = data_dir(override)


def require(name: str, rel: str, override: str = "") -> str:
    """Absolute path of a prepared file, or a UserError saying how to prepare it."""
    root = data_dir(override)
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        raise missing([name], root, rel)
    return path


def missing(names: list, root: str, rel: str = "") -> UserError:
    """The error for datasets absent from root: how to build them, or, where data is only
    received ($T5LITE_DATA_FROM), how to copy them here."""
    what = (rel or ", ".join(names)) + (" are" if len(names) > 1 and not rel else " is")
    how = os.environ.get(FROM_ENV, "")
    if how:
        return UserError(f"{what} not in {root}, and this machine does not build data "
                         f"(${FROM_ENV}): copy it here with `{how} {' '.join(names)}`.")
    return UserError(f"{what} not prepared in {root}. Run `t5lite data prepare "
                     f"{' '.join(names)}` (or set $T5LITE_DATA_DIR / data.data_dir to where it "
                     "was prepared).")
