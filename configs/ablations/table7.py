"""T5 paper (Raffel et al. 2020), Table 7: mean span length of the corruption at 15%: ★ the
i.i.d. baseline (corpus_iid_denoising) against spans of mean length 2, 3, 5, 10
(corpus_span_corruption_len{2,5,10}; 3 is corpus_span_corruption, T5's final objective), each
with the targets length T5's random_spans_helper gives for its spans.

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py), 128 input
tokens, 150 + 150 steps, sentiment accuracy only (add `--tasks translate_en_de
summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base, 512 tokens, 2^19 + 2^18
steps (t5lite/ablations/paper.py SCALES).

    t5lite ablate --table table7 --workdir runs/ablate
"""

from t5lite.ablations import BASELINE_PRETRAIN, PAPER_BASELINE, Row, Table

# The paper's Table 7 (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo), checked row by row
# against the paper's text (arXiv 1910.10683, ar5iv rendering), pinned by
# tests/test_paper_numbers.py
PAPER = {
    2: (83.54, 19.39, 82.09, 72.20, 26.76, 39.99, 27.63),
    3: (83.49, 19.62, 81.84, 72.53, 26.86, 39.65, 27.62),
    5: (83.40, 19.24, 82.05, 72.23, 26.88, 39.40, 27.53),
    10: (82.85, 19.33, 81.84, 70.44, 26.79, 39.49, 27.69),
}

TABLE = Table(
    name="table7",
    caption="Performance of the span-corruption objective for different average span lengths "
            "(corruption rate 15%).",
    label_columns=("Span length",),
    baseline="iid",
    pretrain=BASELINE_PRETRAIN,
    rows=(Row("iid", ("Baseline (i.i.d.)",), paper=PAPER_BASELINE),) + tuple(
        Row(f"span{n}", (str(n),), pretrain=(
            f"data.mixture_or_task=corpus_span_corruption{'' if n == 3 else f'_len{n}'}",
            f"data.feature_lengths.targets:=span_targets(L, 0.15, {n})"), paper=PAPER[n])
        for n in (2, 3, 5, 10)),
)
