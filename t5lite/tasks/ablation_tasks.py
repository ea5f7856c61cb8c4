"""Tasks and mixtures for the T5 paper's ablation tables (configs/ablations/): rows of
t5lite/task_catalog.py, registered on import of t5lite.tasks like the other built-ins, so
`t5lite train --set data.mixture_or_task=...` finds them.

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

Pretraining data sets (Tables 8 and 9; their sources in tasks/paper_data.py), each with the
baseline objective (i.i.d. 15% denoising):
  sp8k_<set>_iid_denoising    Table 8 at the local scales: the 8k vocabulary on the paper's
                              sets, <set> = c4, c4_noclean, c4_realnewslike, c4_webtextlike,
                              wikipedia (TFDS), tbc (the Toronto Books Corpus: files the user
                              provides), and the mixture sp8k_wikipedia_tbc_iid_denoising
  corpus_iid_denoising_tokens2pow{7..29}  Table 9: the local corpus cut to its first 2^k tokens

Also registered for `--scale paper`: c4_<objective> (C4 from TFDS, t5 vocabulary) for every
objective of the tables, Table 8's <set>_iid_denoising and wikipedia_tbc_iid_denoising,
Table 9's c4_iid_denoising_tokens2pow{7..29}, and the paper's benchmarks
(formats.register_paper_tasks).
"""

from __future__ import annotations

from t5lite.task_catalog import (  # noqa: F401  (the variants are catalog data)
    C4_OBJECTIVES, IID_RATES, K_SCALE, MULTITASK_BASE, MULTITASK_K, PAPER_MULTITASK_BASE,
    SPAN_LENGTHS, TEMPERATURES, multitask_members, paper_multitask_members, scaled_k)
from t5lite.tasks import builtin


def register_paper(vocabulary="t5") -> None:
    """--scale paper: C4 (TFDS c4/en, t5 vocabulary) with every objective of the tables, the
    paper's benchmarks (formats.register_paper_tasks) and Table 11's mixtures of both with the
    paper's own K (no K_SCALE), registered again with ``vocabulary``. Nothing is read until a
    dataset is built; the TFDS data dir is $TFDS_DATA_DIR (or ~/tensorflow_datasets)."""
    builtin.register_paper(vocabulary)
