"""T5 paper (Raffel et al. 2020), Table 6: corruption rate of the i.i.d. "replace corrupted
spans" objective (10%, ★ 15%, 25%, 50%).

Each row pretrains on the local corpus with its noise density (tasks corpus_iid_denoising and
corpus_iid_denoising_rate{10,25,50}; targets made long enough for the density), then
finetunes and tests on the local downstream tasks. Scaled down (`--scale tiny`, the default):
tiny T5 v1.1 (configs/quickstart.py), 128 input tokens, 150 + 150 steps, sentiment accuracy
only (add `--tasks translate_en_de summarize_debian` for BLEU / ROUGE-2).
`--scale paper`: T5 base, 512 tokens, 2^19 + 2^18 steps (t5lite/ablations/paper.py SCALES).

    t5lite ablate --table table6 --workdir runs/ablate
    t5lite ablate --table table6 --workdir runs/ablate --rows rate10 rate50 --dry-run
"""

from t5lite.ablations import BASELINE_PRETRAIN, Row, Table

# The paper's Table 6 (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo), checked row by row
# against the paper's text (arXiv 1910.10683, ar5iv rendering), pinned by
# tests/test_paper_numbers.py
PAPER = {
    10: (82.82, 19.00, 80.38, 69.55, 26.87, 39.28, 27.44),
    15: (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65),
    25: (83.00, 19.54, 80.96, 70.48, 27.04, 39.83, 27.47),
    50: (81.27, 19.32, 79.80, 70.33, 27.01, 39.90, 27.49),
}

TABLE = Table(
    name="table6",
    caption="Performance of the i.i.d. corruption objective with different corruption rates.",
    label_columns=("Corruption rate",),
    baseline="rate15",
    pretrain=BASELINE_PRETRAIN,
    rows=tuple(Row(f"rate{p}", (f"{p}%",), pretrain=(
        f"data.mixture_or_task=corpus_iid_denoising{'' if p == 15 else f'_rate{p}'}",
        f"data.feature_lengths.targets:=iid_targets(L, {p / 100})"), paper=PAPER[p])
        for p in (10, 15, 25, 50)),
)
