"""BART's noising functions (Lewis et al. 2019, Section 2.2) beside the T5 paper's Table 4:
the T5 baseline objective and each of BART's corruptions, on the same encoder-decoder. Not a
table of the T5 paper: the BART rows have no published numbers here (their paper cells show
"–"); only the baseline row carries the T5 paper's Table 1 numbers.

Tasks corpus_bart_<noise> (t5lite/tasks/objectives/bart.py, bart_denoising): text infilling (30%
of tokens in Poisson(3)-length spans, each span one mask token, zero-length spans insert
one), sentence permutation (split on the vocabulary's sentence-final pieces), token deletion
(30%), document rotation, token masking (30%), and infilling + permutation (BART's final
model). Inputs are L - 1 corpus tokens corrupted (never longer), targets the L - 1 original
tokens, so the targets are L long.

Scaled down (`--scale tiny`, the default): as Table 4 (configs/quickstart.py, 128 input
tokens, 150 + 150 steps, sentiment accuracy).

    t5lite ablate --table table4_bart --workdir runs/ablate --dry-run
    t5lite ablate --table table4_bart --workdir runs/ablate --rows t5_baseline bart_infilling
"""

from t5lite.ablations import BASELINE_PRETRAIN, PAPER_BASELINE, Row, Table

BART_ROWS = (  # row name / task suffix, label
    ("bart_masking", "BART token masking (30%)"),
    ("bart_deletion", "BART token deletion (30%)"),
    ("bart_infilling", "BART text infilling (30%, Poisson(3) spans)"),
    ("bart_permutation", "BART sentence permutation"),
    ("bart_rotation", "BART document rotation"),
    ("bart_infilling_permutation", "BART text infilling + sentence permutation"),
)

TABLE = Table(
    name="table4_bart",
    caption="BART's noising functions (Lewis et al. 2019) beside the T5 baseline objective "
            "(not a table of the T5 paper).",
    label_columns=("Objective",),
    baseline="t5_baseline",
    rows=(Row("t5_baseline", ("T5 baseline: i.i.d. 15%, spans -> sentinels",),
              pretrain=BASELINE_PRETRAIN, paper=PAPER_BASELINE),)
    + tuple(Row(name, (label,), pretrain=(f"data.mixture_or_task=corpus_{name}",
                                          "data.feature_lengths.targets:=L"))
            for name, label in BART_ROWS),
    paper_note="Only the T5 baseline row is from the T5 paper (its Table 1); the BART rows "
               "have no published numbers on these benchmarks.",
)
