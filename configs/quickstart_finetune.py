"""Quickstart finetuning: the quickstart T5 (configs/quickstart.py) on local sentiment
(Rotten Tomatoes sentences, "sst2 sentence: ..." -> positive / negative), T5-style constant
learning rate (5e-3 for this tiny model) Adafactor, labels generated as text, accuracy on the
validation split.

    t5lite train --config configs/quickstart_finetune.py --workdir runs/qs_finetune \\
        --set checkpoint.init_from=runs/quickstart
`t5lite quickstart` runs pretraining and this finetuning back to back.
"""

from t5lite.config import load_editable


def get_config():
    cfg = load_editable("quickstart")
    cfg.name = "quickstart_finetune"
    cfg.data.mixture_or_task = "sentiment"
    cfg.data.feature_lengths = {"inputs": 64, "targets": 4}
    cfg.data.batch_size = 32
    cfg.data.pack = False
    cfg.train.prepare_data = ("sentiment", "vocab_sp8k")
    cfg.optim.name, cfg.optim.schedule = "adafactor", "constant"
    cfg.optim.learning_rate, cfg.optim.warmup_steps = 5e-3, 0  # 1e-3 stays at the majority class
    cfg.model.dropout_rate = 0.1
    cfg.train.steps = 600
    cfg.train.eval_every = 0
    cfg.train.eval_steps = 4
    cfg.checkpoint.every_steps = 600
    cfg.checkpoint.keep = 1
    cfg.eval.every_steps = 200
    cfg.eval.best_metric = "sentiment/accuracy"
    cfg.eval.batch_size = 64
    return cfg
