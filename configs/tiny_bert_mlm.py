"""BERT tiny, masked-language-model pretraining on the local corpus (8k vocabulary).

    t5lite train --config configs/tiny_bert_mlm.py --workdir runs/bert_mlm
Add NSP with --set model.nsp_head=True and a task that emits nsp_labels.
"""

from t5lite.config import load_config


def get_config():
    cfg = load_config("bert_tiny")
    cfg.name = "tiny_bert_mlm"
    cfg.data.mixture_or_task = "corpus_mlm"
    cfg.data.feature_lengths = {"inputs": 128}
    cfg.data.batch_size = 32
    cfg.data.pack = False  # examples carry per-example nsp_labels; BERT pairs fill a row anyway
    cfg.optim.name, cfg.optim.schedule = "adamw", "linear"
    cfg.optim.learning_rate, cfg.optim.warmup_steps = 1e-3, 50
    cfg.optim.weight_decay = 0.01
    cfg.train.steps = 400
    cfg.train.z_loss = 0.0
    cfg.train.log_every = 10
    cfg.train.eval_every = 100
    cfg.train.eval_steps = 4
    cfg.train.prepare_data = ("corpus", "vocab_sp8k")
    cfg.checkpoint.every_steps = 100
    return cfg
