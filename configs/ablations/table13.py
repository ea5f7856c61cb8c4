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

from t5lite.ablations import BASELINE_PRETRAIN, PAPER_BASELINE, Row, Table


def steps(factor: int) -> tuple:
    return (f"train.steps:={factor} * cfg.train.steps",)


def size(layers_factor: str) -> tuple:
    """T5's 2x / 4x models relative to the scale's (exact at T5 base)."""
    return ("model.d_model:=64 * max(1, round(cfg.model.d_model * 4 / 3 / 64))",
            "model.d_ff:=64 * max(1, round(cfg.model.d_ff * 4 / 3 / 64))",
            "model.num_heads:=round(cfg.model.num_heads * 4 / 3)",
            f"model.num_encoder_layers:=round(cfg.model.num_encoder_layers * {layers_factor})",
            f"model.num_decoder_layers:=round(cfg.model.num_decoder_layers * {layers_factor})")


# The paper's numbers (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo): only the ★ baseline's,
# Table 1's (checked, tests/test_paper_numbers.py). Table 13's own text could not be read
# from the paper here, so its other rows show none rather than unchecked numbers.
TABLE = Table(
    name="table13",
    caption="Comparison of different methods of scaling up our baseline model.",
    label_columns=("Scaling strategy",),
    baseline="baseline",
    pretrain=BASELINE_PRETRAIN,
    rows=(
        Row("baseline", ("Baseline",), paper=PAPER_BASELINE),
        Row("steps4x", ("1× size, 4× training steps",), both=steps(4)),
        Row("batch4x", ("1× size, 4× batch size",),
            both=("data.batch_size:=4 * cfg.data.batch_size",)),
        Row("size2x_steps2x", ("2× size, 2× training steps",), both=size("4 / 3") + steps(2)),
        Row("size4x", ("4× size, 1× training steps",), both=size("8 / 3")),
        Row("ensemble4x", ("4× ensembled",), ensemble=4),
        Row("ensemble4x_finetune_only", ("4× ensembled, fine-tune only",), ensemble=4,
            shared_pretraining=True),
    ),
)
