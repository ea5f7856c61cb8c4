"""ELECTRA tiny, sentence classification on the local sentiment data (8k vocabulary): the
discriminator's [CLS] -> 2 classes (no generator, no RTD head), as BERT tiny finetunes.

    t5lite train --config configs/tiny_electra_sentiment.py --workdir runs/electra_sentiment \
        --set checkpoint.init_from=runs/electra_rtd
"""

from t5lite.config import load_editable


def get_config():
    cfg = load_editable("electra_tiny")
    cfg.name = "tiny_electra_sentiment"
    base = load_editable("tiny_bert_sentiment")  # same data, optimizer and schedule as BERT's
    cfg.data, cfg.optim, cfg.train, cfg.checkpoint = base.data, base.optim, base.train, \
        base.checkpoint
    cfg.model.num_classes = 2
    cfg.data.mixture_or_task = "sentiment_cls"
    cfg.train.prepare_data = ("sentiment", "vocab_sp8k")
    return cfg
