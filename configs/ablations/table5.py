"""T5 paper (Raffel et al. 2020), Table 5: variants of the BERT-style objective. BERT-style and
MASS-style reconstruct the whole uncorrupted text; ★ "replace corrupted spans" (the paper's
baseline, i.i.d. 15%) and "drop corrupted tokens" predict only the corrupted tokens.

Tasks corpus_bert_denoising (90% mask / 10% random, the paper's), corpus_mass_denoising
(targets L long), corpus_iid_denoising and corpus_drop_tokens (the same L - 1 token chunks;
targets sized for 15%).

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py), 128 input
tokens, 150 + 150 steps, sentiment accuracy only (add `--tasks translate_en_de
summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base, 512 tokens, 2^19 + 2^18
steps (t5lite/ablations/paper.py SCALES).

    t5lite ablate --table table5 --workdir runs/ablate
"""

from t5lite.ablations import BASELINE_PRETRAIN, PAPER_BASELINE, Row, Table

# The paper's numbers (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo): its Table 5, checked row by row
# against the paper's text (arXiv 1910.10683, ar5iv rendering), pinned by
# tests/test_paper_numbers.py
TABLE = Table(
    name="table5",
    caption="Comparison of variants of the BERT-style pre-training objective.",
    label_columns=("Objective",),
    baseline="replace_spans",
    pretrain=BASELINE_PRETRAIN,
    rows=(
        Row("bert_style", ("BERT-style (Devlin et al., 2018)",), pretrain=(
            "data.mixture_or_task=corpus_bert_denoising", "data.feature_lengths.targets:=L"),
            paper=(82.96, 19.17, 80.65, 69.85, 26.78, 40.03, 27.41)),
        Row("mass_style", ("MASS-style (Song et al., 2019)",), pretrain=(
            "data.mixture_or_task=corpus_mass_denoising", "data.feature_lengths.targets:=L"),
            paper=(82.32, 19.16, 80.10, 69.28, 26.79, 39.89, 27.55)),
        Row("replace_spans", ("Replace corrupted spans",), paper=PAPER_BASELINE),
        Row("drop_tokens", ("Drop corrupted tokens",), pretrain=(
            "data.mixture_or_task=corpus_drop_tokens",
            "data.feature_lengths.targets:=drop_targets(L, 0.15)"),
            paper=(84.44, 19.31, 80.52, 68.67, 27.07, 39.76, 27.82)),
    ),
)
