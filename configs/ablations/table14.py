"""T5 paper (Raffel et al. 2020), Table 14: the final T5 models, Small to 11B, on every
benchmark (Section 3.7, "Putting it all together").

The recipe (Section 3.7; each setting's source beside it):
- Sizes (the rows): T5 v1.0 Small / Base / Large / 3B / 11B, d_model 512 / 768 / 1024 / 1024 /
  1024, d_ff 2048 / 3072 / 4096 / 16384 / 65536, heads 8 / 12 / 16 / 32 / 128 of 64 / 64 / 64 /
  128 / 128, 6 / 12 / 24 / 24 / 24 layers a stack (t5/models/gin/models/bi_v1_small.gin,
  bi_bert_base.gin, bi_v1_large.gin, bi_v1_3B.gin, bi_v1_11B.gin; the configs t5_1_0_<size>
  hold the same). Written as multiples of the scale's model, so that T5 base at `--scale
  paper` gives exactly those and the tiny scale a toy of each shape.
- Pretraining: span corruption, mean span length 3, 15% (t5/models/gin/objectives/span.gin),
  mixed examples-proportionally with every supervised task (multi-task pretraining, then
  finetuning), the unlabeled set counted as 710,000 / 2,620,000 / 8,660,000 / 33,500,000 /
  133,000,000 examples for Small ... 11B and WMT En-Fr / En-De capped at 1M examples
  (task_catalog.table14_mixture_specs); 1M steps of 2^11 sequences of 512 tokens (~1T
  tokens); Adafactor, inverse square root learning rate, dropout 0.1, the t5 vocabulary, as
  the baseline.
- Finetuning: as the baseline (2^18 steps, constant 1e-3, 128 sequences a batch, continuing
  the pretraining run), except GLUE and SuperGLUE with 8 sequences a batch and a checkpoint
  every 1,000 steps (5,000 for the others); beam search, 4 beams, length penalty alpha 0.6,
  for WMT and CNN/DM (t5/models/gin/beam_search.gin), greedy for the rest.

Where it differs from the paper (said again under the rendered table): the paper finetuned
each GLUE and SuperGLUE task on its own; this table finetunes each benchmark as one mixture,
as every other table does. The paper's numbers are test-set numbers (GLUE and SuperGLUE from
the benchmark servers, WNLI inside GLUE's average; SQuAD on validation); t5lite reports the
validation split and leaves WNLI out of GLUE's average (tasks/README.md), so the columns
compare a recipe, not a leaderboard entry.

Scaled down (`--scale tiny`, the default): the tiny model in each row's proportions, the
local corpus with the local finetuning sets in the same mixing, 150 + 150 steps. `--scale
paper`: the recipe above. `t5lite ablate --table table14 --scale paper --estimate --topology
v5p-128 --rows 11b` compiles a row for a slice: whether it fits and its TPU-hours.

    t5lite ablate --table table14 --workdir runs/ablate --rows small base
"""

from t5lite.ablations import Row, Table, scaled
from t5lite.ablations.paper import PAPER_COLUMNS, PREPARE_LOCAL_SETS

# The paper's Table 14 as printed (arXiv 1910.10683, ar5iv rendering; read cell by cell,
# pinned by tests/test_paper_numbers.py). "Previous best" is the state of the art the paper
# compares with (as of October 24th, 2019; a different paper per column).
COLUMNS = (
    "GLUE Average", "CoLA", "SST-2", "MRPC F1", "MRPC Acc", "STS-B Pearson", "STS-B Spearman",
    "QQP F1", "QQP Acc", "MNLI-m", "MNLI-mm", "QNLI", "RTE", "WNLI",
    "SQuAD EM", "SQuAD F1", "SuperGLUE Average", "BoolQ", "CB F1", "CB Acc", "COPA",
    "MultiRC F1a", "MultiRC EM", "ReCoRD F1", "ReCoRD Acc", "SuperGLUE RTE", "WiC", "WSC",
    "WMT EnDe", "WMT EnFr", "WMT EnRo", "CNN/DM ROUGE-1", "CNN/DM ROUGE-2", "CNN/DM ROUGE-L")
FULL = {
    "Previous best": (89.4, 69.2, 97.1, 93.6, 91.5, 92.7, 92.3,
                      74.8, 90.7, 91.3, 91.0, 99.2, 89.2, 91.8,
                      90.1, 95.5, 84.6, 87.1, 90.5, 95.2, 90.6,
                      84.4, 52.5, 90.6, 90.0, 88.2, 69.9, 89.0,
                      33.8, 43.8, 38.5, 43.47, 20.30, 40.63),
    "T5-Small": (77.4, 41.0, 91.8, 89.7, 86.6, 85.6, 85.0,
                 70.0, 88.0, 82.4, 82.3, 90.3, 69.9, 69.2,
                 79.10, 87.24, 63.3, 76.4, 56.9, 81.6, 46.0,
                 69.3, 26.3, 56.3, 55.4, 73.3, 66.9, 70.5,
                 26.7, 36.0, 26.8, 41.12, 19.56, 38.35),
    "T5-Base": (82.7, 51.1, 95.2, 90.7, 87.5, 89.4, 88.6,
                72.6, 89.4, 87.1, 86.2, 93.7, 80.1, 78.8,
                85.44, 92.08, 76.2, 81.4, 86.2, 94.0, 71.2,
                79.7, 43.1, 75.0, 74.2, 81.5, 68.3, 80.8,
                30.9, 41.2, 28.0, 42.05, 20.34, 39.40),
    "T5-Large": (86.4, 61.2, 96.3, 92.4, 89.9, 89.9, 89.2,
                 73.9, 89.9, 89.9, 89.6, 94.8, 87.2, 85.6,
                 86.66, 93.79, 82.3, 85.4, 91.6, 94.8, 83.4,
                 83.3, 50.7, 86.8, 85.9, 87.8, 69.3, 86.3,
                 32.0, 41.5, 28.1, 42.50, 20.68, 39.75),
    "T5-3B": (88.5, 67.1, 97.4, 92.5, 90.0, 90.6, 89.8,
              74.4, 89.7, 91.4, 91.2, 96.3, 91.1, 89.7,
              88.53, 94.95, 86.4, 89.9, 90.3, 94.4, 92.0,
              86.8, 58.3, 91.2, 90.4, 90.7, 72.1, 90.4,
              31.8, 42.6, 28.2, 42.72, 21.02, 39.94),
    "T5-11B": (90.3, 71.6, 97.5, 92.8, 90.4, 93.1, 92.8,
               75.1, 90.6, 92.2, 91.9, 96.9, 92.8, 94.5,
               91.26, 96.22, 88.9, 91.2, 93.9, 96.8, 94.8,
               88.1, 63.3, 94.1, 93.4, 92.5, 76.9, 93.8,
               32.1, 43.4, 28.1, 43.52, 21.55, 40.69),
}
# the study's columns (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo) read from the full table
SUMMARY = ("GLUE Average", "CNN/DM ROUGE-2", "SQuAD EM", "SuperGLUE Average", "WMT EnDe",
           "WMT EnFr", "WMT EnRo")


def paper(label: str) -> tuple:
    return tuple(FULL[label][COLUMNS.index(c)] for c in SUMMARY)


def size(d_model: str, d_ff: str, heads: str, head_dim: str, layers: str) -> tuple:
    """A T5 v1.0 size as multiples of the scale's model (exact at T5 base)."""
    return (scaled("d_model", d_model, 64), scaled("d_ff", d_ff, 64), scaled("num_heads", heads),
            scaled("head_dim", head_dim), scaled("num_encoder_layers", layers),
            scaled("num_decoder_layers", layers))


# d_model, d_ff, heads, head_dim, layers relative to T5 base (768, 3072, 12 x 64, 12)
SIZES = {"small": ("T5-Small", size("2 / 3", "2 / 3", "2 / 3", "1", "1 / 2")),
         "base": ("T5-Base", ()),
         "large": ("T5-Large", size("4 / 3", "4 / 3", "4 / 3", "1", "2")),
         "3b": ("T5-3B", size("4 / 3", "16 / 3", "8 / 3", "2", "2")),
         "11b": ("T5-11B", size("4 / 3", "64 / 3", "32 / 3", "2", "2"))}

_GLUES = "('paper_glue', 'paper_super_glue')"
_BEAMED = "('paper_wmt_ende', 'paper_wmt_enfr', 'paper_wmt_enro', 'paper_cnn_dailymail')"
TABLE = Table(
    name="table14",
    caption="Performance of our T5 variants on every task we study.",
    label_columns=("Model",),
    rows=tuple(Row(name, (label,), pretrain=(f"data.mixture_or_task=multitask_t5_{name}",),
                   both=sizes, paper=paper(label)) for name, (label, sizes) in SIZES.items()),
    # the local mixtures' members are the corpus and every local finetuning set, whose
    # targets reach 96 tokens (translate_en_de); at paper scale the planner lengthens the
    # mixture's features to the finetuning stages' (512 / 512), as Table 11's
    pretrain=(PREPARE_LOCAL_SETS,
              "data.feature_lengths.targets:=max(96, cfg.data.feature_lengths['targets'])"),
    scale_overrides=(("paper", (
        f"train.steps={2 ** 20}", "data.batch_size=2048"), (
        f"data.batch_size:=8 if cfg.data.mixture_or_task in {_GLUES} else cfg.data.batch_size",
        f"checkpoint.every_steps:=1000 if cfg.data.mixture_or_task in {_GLUES} "
        "else cfg.checkpoint.every_steps",
        f"decode.method:='beam' if cfg.data.mixture_or_task in {_BEAMED} "
        "else cfg.decode.method", "decode.beams=4", "decode.alpha=0.6")),),
    paper_columns=PAPER_COLUMNS,
    paper_std=(0.0,) * len(PAPER_COLUMNS),
    paper_decimals=(("GLUE", 1), ("SGLUE", 1), ("EnDe", 1), ("EnFr", 1), ("EnRo", 1)),
    paper_source=(
        "Paper: arXiv 1910.10683 Table 14, its test-set numbers (GLUE and SuperGLUE from the "
        "benchmark servers, WNLI inside GLUE's average; SQuAD EM on validation; CNN/DM "
        "ROUGE-2-F; WMT BLEU on newstest2014 / 2015 / 2016); bold = the best T5 size. "
        "Previous best (October 2019): " + ", ".join(
            f"{column} {value:g}" for column, value in
            zip(PAPER_COLUMNS, paper("Previous best"))) + "."),
    paper_note=("The paper finetuned each GLUE and SuperGLUE task on its own; here each "
                "benchmark is finetuned as one mixture, reported on validation without WNLI."),
)
