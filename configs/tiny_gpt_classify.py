"""GPT-2 tiny, sequence classification on the local sentiment data: the class head reads the
last non-padding token (the appended <|endoftext|>); GPT-2 BPE vocabulary, task
sentiment_cls_gpt2 (t5lite/tasks/classification.py).

    t5lite train --config configs/tiny_gpt_classify.py --workdir runs/gpt_classify

PEFT on a pretrained GPT (gpt2 vocabulary), e.g. adapters + a fresh head:
    --set checkpoint.init_from=runs/gpt_lm_gpt2 --set model.peft.adapter_dim=16
"""

from t5lite.config import cpu_recipe


def get_config():
    cfg = cpu_recipe("gpt2_tiny", "tiny_gpt_classify", steps=600, every=200, log_every=20)
    cfg.model.vocab_size = 50304  # GPT-2 BPE (50,257) padded to a multiple of 128
    cfg.model.num_classes = 2
    cfg.data.mixture_or_task = "sentiment_cls_gpt2"
    cfg.data.feature_lengths = {"targets": 64}
    cfg.data.pack = False  # the head pools one example per row
    cfg.optim.schedule, cfg.optim.learning_rate = "linear", 5e-4
    cfg.optim.clip_grad_norm = 1.0
    cfg.train.eval_steps = 12
    cfg.train.prepare_data = ("sentiment", "vocab_gpt2")
    cfg.checkpoint.keep = 1
    return cfg
