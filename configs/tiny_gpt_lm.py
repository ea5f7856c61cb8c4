"""GPT-2 tiny, causal language modelling on the local corpus (8k vocabulary).

    t5lite train --config configs/tiny_gpt_lm.py --workdir runs/gpt_lm
"""

from t5lite.config import cpu_recipe


def get_config():
    cfg = cpu_recipe("gpt2_tiny", "tiny_gpt_lm", steps=400, every=100)
    cfg.data.mixture_or_task = "corpus_lm"
    cfg.data.feature_lengths = {"targets": 128}
    cfg.optim.schedule, cfg.optim.learning_rate = "cosine", 1e-3
    cfg.optim.weight_decay, cfg.optim.clip_grad_norm = 0.1, 1.0  # gpt2_tiny's (GPT-2)
    cfg.train.eval_steps = 4
    cfg.train.prepare_data = ("corpus", "vocab_sp8k")
    return cfg
