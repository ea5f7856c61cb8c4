"""Narang et al. 2021 ("Do Transformer Modifications Transfer Across Implementations and
Applications?"), Table 1: each Transformer modification as a config delta on the paper's
vanilla Transformer, measured beside the paper's numbers (t5lite/ablations/modifications.py
holds the rows, the baseline and the paper's numbers).

    t5lite ablate --table modifications --workdir runs/ablate
    t5lite ablate --table modifications --estimate --topology v4-8
"""

from t5lite.ablations.modifications import TABLE  # noqa: F401
