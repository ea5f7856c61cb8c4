"""T5 paper (Raffel et al. 2020), Table 11: multi-task training with different mixing
strategies, against ★ the pretrain-then-finetune baseline.

A multi-task row trains one model from scratch on the baseline objective (i.i.d. denoising on
the corpus) mixed with every local finetuning task (sentiment, translate_en_de,
summarize_debian, topic_debian, topic_brown; mixtures in t5lite/tasks/ablation_tasks.py) for
as many steps as pretraining + finetuning take in the baseline (the paper: 2^19 = 2^18 +
2^18), then tests those params on each downstream task directly, without finetuning:
examples-proportional mixing, rate min(N, K) for K = 2^16 ... 2^21; temperature-scaled, rate
min(N, K) ** (1/T) with K = 2^21 and T = 2, 4, 8; and equal mixing. K is scaled by 2^-5 for
the small local data sets (ablation_tasks.K_SCALE); the labels keep the paper's K.
Differences from the paper: the multi-task rows report the final params (the paper: the best
checkpoint per task), and the pretraining / finetuning step counts must be equal (as in the
paper) for "2 x pretraining steps" to be the baseline's total.

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py), 128 input
tokens, 150 + 150 steps (multi-task: 300), sentiment accuracy only (add `--tasks
translate_en_de summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base, 512 tokens,
2^18 + 2^18 steps (t5lite/ablations.py SCALES). Needs every local finetuning set
(`t5lite data prepare`; the rows prepare what is missing).

    t5lite ablate --table table11 --workdir runs/ablate
"""

from t5lite.ablations import BASELINE_PRETRAIN, Row, Table
from t5lite.tasks.ablation_tasks import MULTITASK_K, TEMPERATURES

ALL_DATA = ("train.prepare_data=corpus,vocab_sp8k,sentiment,translate_en_de,summarize_debian,"
            "topic_debian,topic_brown")


def multitask(name: str, label: str, mixture: str) -> Row:
    return Row(name, (label,), multitask=True, pretrain=(
        f"data.mixture_or_task={mixture}", ALL_DATA,
        "data.feature_lengths.targets:=max(64, cfg.data.feature_lengths['targets'])",
        "train.steps:=2 * cfg.train.steps"))


TABLE = Table(
    name="table11",
    caption="Comparison of multi-task training using different mixing strategies.",
    label_columns=("Mixing strategy",),
    baseline="baseline",
    pretrain=BASELINE_PRETRAIN,
    rows=(Row("baseline", ("Baseline (pre-train/fine-tune)",)),
          multitask("equal", "Equal", "multitask_equal"))
    + tuple(multitask(f"k{k}", f"Examples-proportional, K = 2^{k}", f"multitask_k{k}")
            for k in MULTITASK_K)
    + tuple(multitask(f"t{t}", f"Temperature-scaled, T = {t}", f"multitask_temperature{t}")
            for t in TEMPERATURES),
)
