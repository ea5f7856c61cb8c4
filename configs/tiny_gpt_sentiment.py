"""GPT-2 tiny, generative sentiment finetuning: "sst2 sentence: ... <eos>" is the prompt and the
model writes the label word (seqio PrefixLM layout, loss on targets only); accuracy of the
decoded label on validation, best params in WORKDIR/best. From a tiny_gpt_lm pretraining run
(same 8k vocabulary) or from scratch (drop init_from):

    t5lite train --config configs/tiny_gpt_sentiment.py --workdir runs/gpt_sentiment \\
        --set checkpoint.init_from=runs/gpt_lm
For a classification head on the last token instead, see configs/tiny_gpt_classify.py.

bench/finetune_e2e.sh runs it after tiny_gpt_lm (what it reaches: bench/RESULTS.md,
"Finetuning the tiny configs"); the constant 2e-3 rate is there because a 5e-4 linear decay
stayed at the majority class.
"""

from t5lite.config import cpu_recipe


def get_config():
    cfg = cpu_recipe("gpt2_tiny", "tiny_gpt_sentiment", steps=600, every=600, log_every=20)
    cfg.data.mixture_or_task = "sentiment"
    cfg.data.feature_lengths = {"inputs": 64, "targets": 4}
    cfg.data.pack = False
    cfg.train.prepare_data = ("sentiment", "vocab_sp8k")
    cfg.optim.schedule, cfg.optim.learning_rate, cfg.optim.warmup_steps = "constant", 2e-3, 30
    cfg.optim.clip_grad_norm = 1.0
    cfg.train.eval_every = 0  # evaluated by eval.every_steps (generation), not by loss
    cfg.checkpoint.keep = 1
    cfg.eval.every_steps = 200
    cfg.eval.best_metric = "sentiment/accuracy"
    cfg.eval.batch_size = 64
    cfg.decode.max_length = 4
    return cfg
