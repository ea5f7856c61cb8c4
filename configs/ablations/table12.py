"""T5 paper (Raffel et al. 2020), Table 12: multi-task training combined with finetuning
(Section 3.5.3), against ★ unsupervised pretraining then finetuning.

Rows: multi-task training (Table 11's examples-proportional mixture at K = 2^19, trained for
the baseline's pretraining + finetuning steps, no finetuning, each task's best checkpoint);
multi-task pretraining + finetuning (pretrain on that mixture for the baseline's pretraining
steps, then finetune on each task); leave-one-out multi-task training (per downstream task,
pretrain on the mixture without that task, then finetune on it: <mixture>_without_<task>; a
paper-scale benchmark such as GLUE leaves all its tasks out, as it is finetuned on all of
them); supervised multi-task pretraining (the mixture without the unsupervised task:
multitask_supervised_k19, then finetuning). The mixtures are t5lite/task_catalog.py's
(table12_mixture_specs): at `--scale paper` C4 + the paper's benchmarks with K = 2^19; at the
tiny / small scales the local sets with K scaled by 2^-5, as Table 11's.

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py), 128 input
tokens, 150 + 150 steps, sentiment accuracy only (add `--tasks translate_en_de
summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base, 512 tokens, 2^19 + 2^18
steps (t5lite/ablations/paper.py SCALES). Needs every local finetuning set (`t5lite data
prepare`; the rows prepare what is missing).

    t5lite ablate --table table12 --workdir runs/ablate
    t5lite ablate --table table12 --workdir runs/ablate --rows leave_one_out --dry-run
"""

from t5lite.ablations import BASELINE_PRETRAIN, PAPER_BASELINE, Row, Table
from t5lite.ablations.paper import PREPARE_LOCAL_SETS
from t5lite.task_catalog import TABLE12_LOG2_K

K = TABLE12_LOG2_K


def mixture(name: str) -> tuple:
    """Pretraining on a multi-task mixture (targets long enough for its finetuning tasks)."""
    return (f"data.mixture_or_task={name}", PREPARE_LOCAL_SETS,
            "data.feature_lengths.targets:=max(96, cfg.data.feature_lengths['targets'])")


# The paper's Table 12 (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo), read from the paper's
# text (arXiv 1910.10683, ar5iv rendering) and equal to the same experiments' rows of its
# Table 16; pinned by tests/test_paper_numbers.py. Multi-task training is Table 11's K = 2^19.
PAPER = {
    "multitask": (81.42, 19.24, 79.78, 67.30, 25.21, 36.30, 27.76),
    "multitask_finetune": (83.11, 19.12, 80.26, 71.03, 27.08, 39.80, 28.07),
    "leave_one_out": (81.98, 19.05, 79.97, 71.68, 26.93, 39.79, 27.87),
    "supervised": (79.93, 18.96, 77.38, 65.36, 26.81, 40.13, 28.04),
}
TABLE = Table(
    name="table12",
    caption="Comparison of unsupervised pre-training, multi-task learning, and various forms "
            "of multi-task pre-training.",
    label_columns=("Training strategy",),
    baseline="baseline",
    pretrain=BASELINE_PRETRAIN,
    rows=(
        Row("baseline", ("Unsupervised pre-training + fine-tuning",), paper=PAPER_BASELINE),
        Row("multitask", ("Multi-task training",), multitask=True,
            pretrain=mixture(f"multitask_k{K}"), paper=PAPER["multitask"]),
        Row("multitask_finetune", ("Multi-task pre-training + fine-tuning",),
            pretrain=mixture(f"multitask_k{K}"), paper=PAPER["multitask_finetune"]),
        Row("leave_one_out", ("Leave-one-out multi-task training",), leave_one_out=True,
            pretrain=mixture(f"multitask_k{K}"), paper=PAPER["leave_one_out"]),
        Row("supervised", ("Supervised multi-task pre-training",),
            pretrain=mixture(f"multitask_supervised_k{K}"), paper=PAPER["supervised"]),
    ),
)
