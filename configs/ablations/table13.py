"""T5 paper (Raffel et al. 2020), Table 13: ways to use 4x the baseline's compute (Section
3.6), against ★ the baseline.

Rows: 1x size with 4x the training steps; 1x size with 4x the batch size; a 2x bigger model
for 2x the steps; a 4x bigger model; 4 models each pretrained and finetuned separately,
ensembled; and 4 finetunings of one pretrained model, ensembled ("fine-tune only", the one
row under 4x compute). The steps and batch size scale in both stages (the caption: every row
but the last uses 4x the baseline's computation, which finetuning is part of). The bigger
models are T5's own for this table (t5/models/gin/models/bi_v1_2x.gin, bi_v1_4x.gin: BERT
large's width, d_model 1024, d_ff 4096, 16 heads of 64, with 16 / 32 layers in each stack),
written relative to the scale's model (d_model, d_ff and heads x 4/3, layers x 4/3 or 8/3)
so that T5 base gives exactly those. An ensemble decodes greedily with the mean of its
members' logits (t5lite/eval/decoding.py); member m of seed k trains with seed 4k + m, so
member 0 of seed 0 is the baseline's run.

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py), 128 input
tokens, 150 + 150 steps, sentiment accuracy only (add `--tasks translate_en_de
summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base, 512 tokens, 2^19 + 2^18
steps (t5lite/ablations/paper.py SCALES).

    t5lite ablate --table table13 --workdir runs/ablate
    t5lite ablate --table table13 --workdir runs/ablate --rows ensemble4x --dry-run
"""

from t5lite.ablations import BASELINE_PRETRAIN, PAPER_BASELINE, Row, Table, scaled


def steps(factor: int) -> tuple:
    return (f"train.steps:={factor} * cfg.train.steps",)


def size(layers_factor: str) -> tuple:
    """T5's 2x / 4x models relative to the scale's (exact at T5 base)."""
    return (scaled("d_model", "4 / 3", 64), scaled("d_ff", "4 / 3", 64),
            scaled("num_heads", "4 / 3"), scaled("num_encoder_layers", layers_factor),
            scaled("num_decoder_layers", layers_factor))


# The paper's Table 13 (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo), read from the paper's
# text (arXiv 1910.10683, ar5iv rendering); pinned by tests/test_paper_numbers.py. Its Table 16
# agrees on every cell but one: the 4x ensemble's EnRo, 28.57 here and 28.09 there (the
# fine-tune-only ensemble's number); the table's own text, which bolds 28.57 as the column's
# best and says the ensemble beat every other method on EnRo, is followed.
PAPER = {
    "steps4x": (85.33, 19.33, 82.45, 74.72, 27.08, 40.66, 27.93),
    "batch4x": (84.60, 19.42, 82.52, 74.64, 27.07, 40.60, 27.84),
    "size2x_steps2x": (86.18, 19.66, 84.18, 77.18, 27.52, 41.03, 28.19),
    "size4x": (85.91, 19.73, 83.86, 78.04, 27.47, 40.71, 28.10),
    "ensemble4x": (84.77, 20.10, 83.09, 71.74, 28.05, 40.53, 28.57),
    "ensemble4x_finetune_only": (84.05, 19.57, 82.36, 71.55, 27.55, 40.22, 28.09),
}
TABLE = Table(
    name="table13",
    caption="Comparison of different methods of scaling up our baseline model.",
    label_columns=("Scaling strategy",),
    baseline="baseline",
    pretrain=BASELINE_PRETRAIN,
    rows=(
        Row("baseline", ("Baseline",), paper=PAPER_BASELINE),
        Row("steps4x", ("1× size, 4× training steps",), both=steps(4),
            paper=PAPER["steps4x"]),
        Row("batch4x", ("1× size, 4× batch size",),
            both=("data.batch_size:=4 * cfg.data.batch_size",), paper=PAPER["batch4x"]),
        Row("size2x_steps2x", ("2× size, 2× training steps",), both=size("4 / 3") + steps(2),
            paper=PAPER["size2x_steps2x"]),
        Row("size4x", ("4× size, 1× training steps",), both=size("8 / 3"),
            paper=PAPER["size4x"]),
        Row("ensemble4x", ("4× ensembled",), ensemble=4, paper=PAPER["ensemble4x"]),
        Row("ensemble4x_finetune_only", ("4× ensembled, fine-tune only",), ensemble=4,
            shared_pretraining=True, paper=PAPER["ensemble4x_finetune_only"]),
    ),
)
