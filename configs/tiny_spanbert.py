"""SpanBERT tiny (Joshi et al. 2020): BERT tiny with span masking (whole-word spans, lengths
Geo(0.2) clipped at 10 words, 15% of tokens, 80/10/10 per span) and the Span Boundary Objective
head, no NSP, on packed single-segment rows of the local corpus (8k vocabulary).

    t5lite train --config configs/tiny_spanbert.py --workdir runs/spanbert
Loss = MLM + SBO (metrics mlm_loss, sbo_loss, sbo_accuracy). Same schedule as tiny_bert_mlm.py.
"""

from t5lite.config import load_editable


def get_config():
    cfg = load_editable("tiny_bert_mlm")
    cfg.name = "tiny_spanbert"
    cfg.model.sbo_head = True
    cfg.data.mixture_or_task = "corpus_spanbert"
    cfg.data.pack = True  # single contiguous segments; no per-example labels
    return cfg
