"""Tasks and mixtures for the T5 paper's ablation tables (configs/ablations/), registered on
import of t5lite.tasks like the built-ins, so `t5lite train --set data.mixture_or_task=...`
finds them.

Objective variants (pretraining on the local corpus, 8k vocabulary):
  corpus_iid_denoising_rate{10,25,50}  Table 6: i.i.d. noise, spans -> sentinels, at 10/25/50%
  corpus_span_corruption_len{2,5,10}   Table 7: 15% noise in spans of mean length 2/5/10
(15% i.i.d. is the built-in corpus_iid_denoising, mean span 3 the built-in
corpus_span_corruption; the other objectives of Tables 2-5 are built-ins too.)

Multi-task mixtures (Table 11): the paper's unsupervised baseline task (corpus_iid_denoising)
plus every local finetuning task, mixed
  multitask_k{16..21}        examples-proportionally, rate min(N, K) with K = 2^k * K_SCALE
  multitask_temperature{2,4,8}  min(N, K) ** (1/T) with the paper's K = 2^21 * K_SCALE
  multitask_equal            equally.
The paper's K values are for C4 and GLUE/SuperGLUE/WMT-sized tasks; the local sets are
smaller (sentiment 3k, translation 15k, Debian sets 47k examples, corpus 303k lines), so K is
scaled by K_SCALE = 2^-5 for them: K = 2^16 then caps the corpus near the largest task, as in
the paper. At `--scale paper` the rows use paper_multitask_* instead: C4 plus the paper's
benchmarks (TFDS) with the paper's K unscaled.

Also registered for `--scale paper`: c4_<objective> (C4 from TFDS, t5 vocabulary) for every
objective of the tables, and the paper's benchmarks (formats.register_paper_tasks).
"""

from __future__ import annotations

from t5lite.task_catalog import (  # noqa: F401  (the variants as data: `tasks list` reads them)
    C4_OBJECTIVES, IID_RATES, MULTITASK_BASE, MULTITASK_K, PAPER_MULTITASK_BASE, SPAN_LENGTHS,
    TEMPERATURES, paper_multitask_members)
from t5lite.tasks import registry

K_SCALE = 2.0 ** -5


def multitask_members() -> list[str]:
    return [MULTITASK_BASE] + list(registry.FINETUNE)


def scaled_k(log2_k: int) -> int:
    return int(2 ** log2_k * K_SCALE)


def register_paper(vocabulary="t5") -> None:
    """--scale paper: C4 (TFDS c4/en, t5 vocabulary) with every objective of the tables, the
    paper's benchmarks (formats.register_paper_tasks) and Table 11's mixtures of both with the
    paper's own K (no K_SCALE). Nothing is read until a dataset is built; the TFDS data dir is
    $TFDS_DATA_DIR (or ~/tensorflow_datasets)."""
    import seqio
    from t5lite.tasks import formats
    c4 = lambda: seqio.TfdsDataSource(formats.TFDS["c4"], splits=["train", "validation"])
    for objective in C4_OBJECTIVES:
        registry.register_pretraining_task(f"c4_{objective}", objective, vocabulary=vocabulary,
                                           source=c4(), from_lines=False)
    for rate in IID_RATES:
        registry.register_pretraining_task(f"c4_iid_denoising_rate{rate}", "iid_denoising",
                                           vocabulary=vocabulary, source=c4(),
                                           from_lines=False, noise_density=rate / 100)
    for length in SPAN_LENGTHS:
        registry.register_pretraining_task(f"c4_span_corruption_len{length}", "span_corruption",
                                           vocabulary=vocabulary, source=c4(),
                                           from_lines=False,
                                           mean_noise_span_length=float(length))
    formats.register_paper_tasks(vocabulary)
    tasks = paper_multitask_members()
    for k in MULTITASK_K:
        registry.register_mixture(f"paper_multitask_k{k}", tasks, "proportional", cap=2 ** k)
    for t in TEMPERATURES:
        registry.register_mixture(f"paper_multitask_temperature{t}", tasks, "temperature",
                                  cap=2 ** 21, temperature=float(t))
    registry.register_mixture("paper_multitask_equal", tasks, "equal")


def register() -> None:
    for rate in IID_RATES:
        registry.register_pretraining_task(f"corpus_iid_denoising_rate{rate}", "iid_denoising",
                                           noise_density=rate / 100)
    for length in SPAN_LENGTHS:
        registry.register_pretraining_task(f"corpus_span_corruption_len{length}",
                                           "span_corruption",
                                           mean_noise_span_length=float(length))
    tasks = multitask_members()
    for k in MULTITASK_K:
        registry.register_mixture(f"multitask_k{k}", tasks, "proportional", cap=scaled_k(k))
    for t in TEMPERATURES:
        registry.register_mixture(f"multitask_temperature{t}", tasks, "temperature",
                                  cap=scaled_k(21), temperature=float(t))
    registry.register_mixture("multitask_equal", tasks, "equal")
    register_paper()
