"""Quickstart pretraining: T5 v1.1 tiny, span corruption on the local corpus, 8k vocabulary.

300 steps (what it measured: bench/RESULTS.md, "Quickstart and the end-to-end runs"):
    t5lite train --config configs/quickstart.py --workdir runs/quickstart
The corpus and the SentencePiece vocabulary are built on first use (train.prepare_data).
"""

from t5lite.config import load_editable


def get_config():
    cfg = load_editable("t5_1_1_tiny")
    cfg.name = "quickstart"
    cfg.data.mixture_or_task = "corpus_span_corruption"
    cfg.data.feature_lengths = {"inputs": 128, "targets": 32}
    cfg.data.batch_size = 32
    cfg.optim.name, cfg.optim.schedule = "adafactor", "rsqrt"
    cfg.optim.learning_rate, cfg.optim.warmup_steps = 1e-2, 100
    cfg.train.steps = 300
    cfg.train.log_every = 10
    cfg.train.eval_every = 100
    cfg.train.eval_steps = 4
    cfg.train.prepare_data = ("corpus", "vocab_sp8k")
    cfg.checkpoint.every_steps = 100
    cfg.checkpoint.keep = 3
    return cfg
