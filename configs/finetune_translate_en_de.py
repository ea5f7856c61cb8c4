"""English -> German translation finetuning (local Ding sentence pairs, task translate_en_de,
"translate English to German: ..." -> German), BLEU (sacrebleu) on validation every
eval.every_steps; the best params by BLEU land in WORKDIR/best. From the quickstart T5:

    t5lite train --config configs/finetune_translate_en_de.py --workdir runs/en_de \\
        --set checkpoint.init_from=runs/quickstart/pretrain
    t5lite eval --checkpoint runs/en_de/best --task translate_en_de --split test \\
        --set decode.method=beam --set decode.beams=4

The 8k SentencePiece vocabulary was trained on English text; German words split into many
pieces, and a tiny CPU model gives a low BLEU. Use a bigger model (t5_1_1_small) and the
t5 vocabulary (translate_en_de_t5, model.vocab_size=32128) for real numbers.
"""

from t5lite.config import load_editable


def get_config():
    cfg = load_editable("quickstart")
    cfg.name = "finetune_translate_en_de"
    cfg.data.mixture_or_task = "translate_en_de"
    # the prepared pairs' German side: 11 of the first 1,000 train targets are longer than 64
    # tokens (longest 89), more than data.max_trimmed's 1%, so 64 refused to train
    cfg.data.feature_lengths = {"inputs": 64, "targets": 96}
    cfg.data.batch_size = 32
    cfg.data.pack = True
    cfg.train.prepare_data = ("translate_en_de", "vocab_sp8k")
    cfg.optim.name, cfg.optim.schedule = "adafactor", "constant"
    cfg.optim.learning_rate, cfg.optim.warmup_steps = 1e-3, 0
    cfg.train.steps = 600
    cfg.train.eval_every = 0
    cfg.checkpoint.every_steps = 200
    cfg.checkpoint.keep = 1
    cfg.eval.every_steps = 200
    cfg.eval.max_examples = 200
    cfg.eval.best_metric = "translate_en_de/bleu"
    cfg.eval.batch_size = 64
    cfg.decode.max_length = 64
    return cfg
