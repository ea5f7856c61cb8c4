"""T5 paper (Raffel et al. 2020), Table 9: pretraining data set size (★ the full data set, and
C4 cut to its first 2^29, 2^27, 2^25 and 2^23 tokens, repeated 64, 256, 1,024 and 4,096 times
over the 2^35 tokens of pretraining).

Each row pretrains with the baseline objective (i.i.d. 15% denoising) on the first 2^k tokens
of the train split in their stored order (whole examples from the first until they hold 2^k
tokens, the same ones on every host and for every seed, repeated for the whole run; tasks
c4_iid_denoising_tokens2pow<k> at `--scale paper`, corpus_iid_denoising_tokens2pow<k> on the
local corpus: t5lite/tasks/paper_data.py FirstTokens), then finetunes as the baseline. The
validation split is left whole, so pretraining's validation loss shows what memorising costs.

Scaled down, a row keeps the paper's ratio of trained to stored tokens: k is the largest
power of two with 2^k <= trained tokens / repeats, where trained tokens = steps x batch x
inputs length (2^35 at `--scale paper`: exactly the paper's 2^29 ... 2^23). `--scale tiny`
trains 150 x 32 x 128 = 614,400 tokens: 2^13, 2^11, 2^9 and 2^7 tokens of the local corpus,
75, 300, 1,200 and 4,800 repeats (a few fewer where a last example runs past 2^k); `--scale
small` (1,200 x 32 x 64 = 2,457,600 tokens) 2^15 ... 2^9 with the same repeats. With other
steps, batch or length (`--set`) the repeats stay within twice the paper's (k from 7 to 29:
task_catalog.FIRST_TOKENS_LOG2).

    t5lite ablate --table table9 --workdir runs/ablate
    t5lite ablate --table table9 --workdir runs/ablate --scale paper --dry-run
"""

from t5lite.ablations import BASELINE_PRETRAIN, Row, Table
from t5lite.task_catalog import FIRST_TOKENS_LOG2

# The paper's Table 9 (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo), checked row by row
# against the paper's text (arXiv 1910.10683, ar5iv rendering), pinned by
# tests/test_paper_numbers.py
PAPER = {
    0: (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65),
    29: (82.87, 19.19, 80.97, 72.03, 26.83, 39.74, 27.63),
    27: (82.62, 19.20, 79.78, 69.97, 27.02, 39.71, 27.33),
    25: (79.55, 18.57, 76.27, 64.76, 26.38, 39.56, 26.80),
    23: (76.34, 18.33, 70.92, 59.29, 26.37, 38.84, 25.81),
}
PAPER_TRAINED_LOG2 = 35  # 2^19 steps x 128 x 512 tokens


def first_tokens(repeats: int) -> str:
    """The pretraining task of a row: the corpus cut to 2^k tokens, k from the stage's trained
    tokens (an override computed per scale; renamed to C4's task at --scale paper)."""
    k = (f"max({FIRST_TOKENS_LOG2[0]}, min({FIRST_TOKENS_LOG2[-1]}, "
         f"(cfg.train.steps * cfg.data.batch_size * L // {repeats}).bit_length() - 1))")
    return f"data.mixture_or_task:=f'corpus_iid_denoising_tokens2pow{{{k}}}'"


TABLE = Table(
    name="table9",
    caption="Measuring the effect of repeating data during pre-training: the first n tokens "
            "of C4, repeated over the 2^35 tokens of pre-training.",
    label_columns=("Number of tokens", "Repeats"),
    baseline="full",
    pretrain=BASELINE_PRETRAIN,
    rows=(Row("full", ("Full data set", "0"), paper=PAPER[0]),) + tuple(
        Row(f"tokens2pow{k}", (f"2^{k}", f"{2 ** (PAPER_TRAINED_LOG2 - k):,}"),
            pretrain=(first_tokens(2 ** (PAPER_TRAINED_LOG2 - k)),), paper=PAPER[k])
        for k in (29, 27, 25, 23)),
)
