"""T5 paper (Raffel et al. 2020), Table 7: mean span length of the corruption at 15%: ★ the
i.i.d. baseline (corpus_iid_denoising) against spans of mean length 2, 3, 5, 10
(corpus_span_corruption_len{2,5,10}; 3 is corpus_span_corruption, T5's final objective), each
with seqio's exact targets length for its spans.

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py), 128 input
tokens, 150 + 150 steps, sentiment accuracy only (add `--tasks translate_en_de
summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base, 512 tokens, 2^18 + 2^18
steps (t5lite/ablations.py SCALES).

    t5lite ablate --table table7 --workdir runs/ablate
"""

from t5lite.ablations import BASELINE_PRETRAIN, Row, Table

TABLE = Table(
    name="table7",
    caption="Performance of the span-corruption objective for different average span lengths "
            "(corruption rate 15%).",
    label_columns=("Span length",),
    baseline="iid",
    pretrain=BASELINE_PRETRAIN,
    rows=(Row("iid", ("Baseline (i.i.d.)",)),) + tuple(
        Row(f"span{n}", (str(n),), pretrain=(
            f"data.mixture_or_task=corpus_span_corruption{'' if n == 3 else f'_len{n}'}",
            f"data.feature_lengths.targets:=span_targets(L, 0.15, {n})"))
        for n in (2, 3, 5, 10)),
)
