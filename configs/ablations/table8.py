"""T5 paper (Raffel et al. 2020), Table 8: pretraining data sets (★ C4, C4 unfiltered,
RealNews-like, WebText-like, Wikipedia, Wikipedia + Toronto Books Corpus).

Each row pretrains with the baseline objective (i.i.d. 15% denoising) on one data set, read
from TFDS (names and versions: t5lite/tasks/formats.py TFDS): c4/en, c4/en.noclean,
c4/realnewslike, c4/webtextlike (TFDS needs OpenWebText's URL list downloaded by hand for it),
wikipedia/20230601.en (the paper read the 2019-03-01 dump, which TFDS can no longer build; its
last 1% is held out for validation). The Toronto Books Corpus is not in TFDS: the Wikipedia +
TBC row reads it from text files you provide, <data dir>/tbc/train.txt and validation.txt (one
paragraph per line; data.data_dir or $T5LITE_DATA_DIR), and without them stops with a one-line
error when its data is first read, before any training step. Wikipedia and TBC are mixed by
the paper's sizes (16GB of the 20GB are Wikipedia), as concatenating them would.

Every scale reads these data sets (no local stand-in has the paper's domains): `--scale
paper` with the t5 vocabulary (tasks <set>_iid_denoising), the tiny and small scales with the
local 8k vocabulary and model (sp8k_<set>_iid_denoising), a cheap check of the data before a
paper-scale run; both need the TFDS data sets in $TFDS_DATA_DIR (`tfds build c4/realnewslike`
...; the C4 variants are Beam jobs over a Common Crawl dump). `--dry-run` needs no data.

    t5lite ablate --table table8 --workdir gs://bucket/ablate --scale paper --dry-run
    TFDS_DATA_DIR=gs://bucket/tfds t5lite ablate --table table8 --workdir gs://bucket/ablate \\
        --scale paper --rows c4 wikipedia
"""

from t5lite.ablations import BASELINE_PRETRAIN, Row, Table

# The paper's Table 8 (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo), checked row by row
# against the paper's text (arXiv 1910.10683, ar5iv rendering), pinned by
# tests/test_paper_numbers.py
PAPER = {
    "c4": (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65),
    "c4_noclean": (81.46, 19.14, 78.78, 68.04, 26.55, 39.34, 27.21),
    "c4_realnewslike": (83.83, 19.23, 80.39, 72.38, 26.75, 39.90, 27.48),
    "c4_webtextlike": (84.03, 19.31, 81.42, 71.40, 26.80, 39.74, 27.59),
    "wikipedia": (81.85, 19.31, 81.29, 68.01, 26.94, 39.69, 27.67),
    "wikipedia_tbc": (83.65, 19.28, 82.08, 73.24, 26.77, 39.63, 27.57),
}

DATA_SETS = {  # row: (the paper's label, its size in the paper)
    "c4": ("C4", "745GB"),
    "c4_noclean": ("C4, unfiltered", "6.1TB"),
    "c4_realnewslike": ("RealNews-like", "35GB"),
    "c4_webtextlike": ("WebText-like", "17GB"),
    "wikipedia": ("Wikipedia", "16GB"),
    "wikipedia_tbc": ("Wikipedia + TBC", "20GB"),
}

TABLE = Table(
    name="table8",
    caption="Performance resulting from pre-training on different data sets.",
    label_columns=("Data set", "Size"),
    baseline="c4",
    pretrain=BASELINE_PRETRAIN,
    paper_note="TFDS has no Toronto Books Corpus: the Wikipedia + TBC row needs its text in "
               "<data dir>/tbc/{train,validation}.txt, which you provide.",
    # the local scales' task names; --scale paper renames sp8k_* to the t5-vocabulary tasks
    rows=tuple(Row(name, label, pretrain=(f"data.mixture_or_task=sp8k_{name}_iid_denoising",),
                   paper=PAPER[name])
               for name, label in DATA_SETS.items()),
)
