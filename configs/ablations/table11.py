"""T5 paper (Raffel et al. 2020), Table 11: multi-task training with different mixing
strategies, against ★ the pretrain-then-finetune baseline.

A multi-task row trains one model from scratch on the baseline objective (i.i.d. denoising)
mixed with every downstream task for as many steps as the baseline's pretraining plus
finetuning (the paper: 2^19 + 2^18 = 786,432), keeps every checkpoint, and reports for each
task its best checkpoint on validation (the paper's selection), without finetuning:
examples-proportional mixing, rate min(N, K) for K = 2^16 ... 2^21; temperature-scaled, rate
min(N, K) ** (1/T) with K = 2^21 and T = 2, 4, 8; and equal mixing. At `--scale paper` the
mixtures are C4 + the paper's benchmarks (paper_multitask_*) with the paper's K; on the small
local sets (tiny / small scales: corpus + sentiment, translate_en_de, summarize_debian,
topic_debian, topic_brown) K is scaled by 2^-5 (ablation_tasks.K_SCALE), the labels keep the
paper's K.

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py), 128 input
tokens, 150 + 150 steps (multi-task: 300), sentiment accuracy only (add `--tasks
translate_en_de summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base, 512 tokens,
2^19 + 2^18 steps (t5lite/ablations/paper.py SCALES). The local scales need every local
finetuning set (`t5lite data prepare`; the rows prepare what is missing); `--scale paper`
prepares nothing (C4 and the benchmarks come from TFDS).

A multi-task model is trained on one mixture, so with one length per feature: each is the
longest of the pretraining stage's and every finetuning stage's, so that no task's examples
are cut shorter than its own finetuning would cut them (at paper scale 512 / 512: CNN/DM's
summaries and WMT's translations whole up to 512 tokens; the denoising task's targets stay
as long as its objective makes them).

    t5lite ablate --table table11 --workdir runs/ablate
"""

from t5lite.ablations import BASELINE_PRETRAIN, Row, Table
from t5lite.ablations.paper import PREPARE_LOCAL_SETS
from t5lite.tasks.ablation_tasks import MULTITASK_K, TEMPERATURES


def multitask(name: str, label: str, mixture: str) -> Row:
    # targets as long as the longest local finetuning set's (translate_en_de: 96); at paper
    # scale each task's own finetuning length is kept by the planner, which lengthens a
    # multi-task row's features to those of its finetuning stages (all 512 there)
    return Row(name, (label,), multitask=True, pretrain=(
        f"data.mixture_or_task={mixture}", PREPARE_LOCAL_SETS,
        "data.feature_lengths.targets:=max(96, cfg.data.feature_lengths['targets'])"),
        paper=PAPER.get(name))


# The paper's Table 11 (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo), every row checked
# against the paper's text (arXiv 1910.10683, ar5iv rendering), pinned by
# tests/test_paper_numbers.py
PAPER = {
    "baseline": (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65),
    "equal": (76.13, 19.02, 76.51, 63.37, 23.89, 34.31, 26.78),
    "k16": (80.45, 19.04, 77.25, 69.95, 24.35, 34.99, 27.10),
    "k17": (81.56, 19.12, 77.00, 67.91, 24.36, 35.00, 27.25),
    "k18": (81.67, 19.07, 78.17, 67.94, 24.57, 35.19, 27.39),
    "k19": (81.42, 19.24, 79.78, 67.30, 25.21, 36.30, 27.76),
    "k20": (80.80, 19.24, 80.36, 67.38, 25.66, 36.93, 27.68),
    "k21": (79.83, 18.79, 79.50, 65.10, 25.82, 37.22, 27.13),
    "t2": (81.90, 19.28, 79.42, 69.92, 25.42, 36.72, 27.20),
    "t4": (80.56, 19.22, 77.99, 69.54, 25.04, 35.82, 27.45),
    "t8": (77.21, 19.10, 77.14, 66.07, 24.55, 35.35, 27.17),
}

TABLE = Table(
    name="table11",
    caption="Comparison of multi-task training using different mixing strategies.",
    label_columns=("Mixing strategy",),
    baseline="baseline",
    pretrain=BASELINE_PRETRAIN,
    rows=(Row("baseline", ("Baseline (pre-train/fine-tune)",), paper=PAPER["baseline"]),
          multitask("equal", "Equal", "multitask_equal"))
    + tuple(multitask(f"k{k}", f"Examples-proportional, K = 2^{k}", f"multitask_k{k}")
            for k in MULTITASK_K)
    + tuple(multitask(f"t{t}", f"Temperature-scaled, T = {t}", f"multitask_temperature{t}")
            for t in TEMPERATURES),
)
