"""GPT-2 tiny, causal language modelling on the local corpus (8k vocabulary).

    t5lite train --config configs/tiny_gpt_lm.py --workdir runs/gpt_lm
"""

from t5lite.config import load_config


def get_config():
    cfg = load_config("gpt2_tiny")
    cfg.name = "tiny_gpt_lm"
    cfg.data.mixture_or_task = "corpus_lm"
    cfg.data.feature_lengths = {"targets": 128}
    cfg.data.batch_size = 32
    cfg.optim.name, cfg.optim.schedule = "adamw", "cosine"
    cfg.optim.learning_rate, cfg.optim.warmup_steps = 1e-3, 50
    cfg.optim.clip_grad_norm = 1.0
    cfg.train.steps = 400
    cfg.train.z_loss = 0.0
    cfg.train.log_every = 10
    cfg.train.eval_every = 100
    cfg.train.eval_steps = 4
    cfg.train.prepare_data = ("corpus", "vocab_sp8k")
    cfg.checkpoint.every_steps = 100
    return cfg
