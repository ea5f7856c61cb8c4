"""T5 paper (Raffel et al. 2020), Table 4: three disparate pretraining objectives, prefix
language modeling, BERT-style denoising and deshuffling (the paper marks no baseline here).

Tasks corpus_prefix_lm (a chunk split at a random point: prefix -> continuation),
corpus_bert_denoising (15% of tokens: 90% mask / 10% random, as the paper's reference;
target = the original text) and corpus_deshuffling (shuffled tokens -> original order); each
target is a full L - 1-token chunk, so the targets are L long; prefix-LM and deshuffling
chunks stay inside one document (as T5's reference). Encoder-decoder as in the paper.

Scaled down (`--scale tiny`, the default): tiny T5 v1.1 (configs/quickstart.py), 128 input
tokens, 150 + 150 steps, sentiment accuracy only (add `--tasks translate_en_de
summarize_debian` for BLEU / ROUGE-2). `--scale paper`: T5 base, 512 tokens, 2^19 + 2^18
steps (t5lite/ablations/paper.py SCALES).

    t5lite ablate --table table4 --workdir runs/ablate
"""

from t5lite.ablations import Row, Table

# The paper's numbers (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr, EnRo): its Table 4, checked row by row
# against the paper's text (arXiv 1910.10683, ar5iv rendering), pinned by
# tests/test_paper_numbers.py
TABLE = Table(
    name="table4",
    caption="Performance of the three disparate pre-training objectives.",
    label_columns=("Objective",),
    rows=tuple(Row(name, (label,), pretrain=(f"data.mixture_or_task={task}",
                                             "data.feature_lengths.targets:=L"), paper=paper)
               for name, label, task, paper in (
                   ("prefix_lm", "Prefix language modeling", "corpus_prefix_lm",
                    (80.69, 18.94, 77.99, 65.27, 26.86, 39.73, 27.49)),
                   ("bert_style", "BERT-style (Devlin et al., 2018)", "corpus_bert_denoising",
                    (82.96, 19.17, 80.65, 69.85, 26.78, 40.03, 27.41)),
                   ("deshuffling", "Deshuffling", "corpus_deshuffling",
                    (73.17, 18.59, 67.61, 58.47, 26.11, 39.30, 25.62)))),
)
