"""data.tfds_data_dir: where the TFDS-backed tasks (C4 and its variants, the paper's GLUE /
SuperGLUE / SQuAD / CNN-DM / WMT benchmarks: seqio.TfdsDataSource) read their prepared
datasets. A gs:// bucket lets every host of a pod read the same copy in place, with nothing
prepared or copied on the hosts; "" leaves TFDS's own choice ($TFDS_DATA_DIR, else
~/tensorflow_datasets).
"""

from __future__ import annotations

import os

import seqio

from t5lite.errors import UserError


def resolve(path: str) -> str:
    """A local path made absolute, a gs:// URL as given; UserError for another scheme (TFDS
    reads gs:// through TensorFlow's filesystem, which knows no other object store here)."""
    if "://" in path:
        if not path.startswith("gs://"):
            raise UserError(f"data.tfds_data_dir={path!r}: give a local path or a gs:// URL.")
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))


def use_tfds_data_dir(path: str) -> str:
    """Points seqio's TFDS sources at `path` for this process (seqio's one global override, as
    seqio's own cache job sets it). -> the resolved path, or "" when TFDS's default stands."""
    if not path:
        return ""
    path = resolve(path)
    seqio.set_tfds_data_dir_override(path)
    return path
