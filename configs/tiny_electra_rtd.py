"""ELECTRA tiny, replaced-token-detection pretraining on the local corpus (8k vocabulary): BERT
tiny's encoder as the discriminator, a 32-wide generator (shared embeddings) on the same
corpus_mlm rows as configs/tiny_bert_mlm.py, loss = MLM(generator) + 50 * RTD.

    t5lite train --config configs/tiny_electra_rtd.py --workdir runs/electra_rtd
Then finetune the discriminator: configs/tiny_electra_sentiment.py with
--set checkpoint.init_from=runs/electra_rtd.
"""

from t5lite.config import load_editable


def get_config():
    cfg = load_editable("electra_tiny")
    cfg.name = "tiny_electra_rtd"
    base = load_editable("tiny_bert_mlm")  # same data, optimizer and schedule as BERT tiny MLM
    cfg.data, cfg.optim, cfg.train, cfg.checkpoint = base.data, base.optim, base.train, \
        base.checkpoint
    cfg.optim.clip_grad_norm = 1.0  # the preset's: unclipped, 50 x RTD collapsed the encoder
    return cfg
